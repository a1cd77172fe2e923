"""Write the shipped trace disaggsdk/bench/traces/code_assistant.jsonl (seeded: the same file each time).

A coding assistant's traffic as its shape, not its text: two kinds of request in one stream.
Chat turns (65%): a question with a little context, 96-384 prompt tokens, 24-96 output tokens.
Edits with code context (35%): a file or two pasted in, 768-1536 prompt tokens, 64-160 output tokens.
Lengths only (``input_len``), so the same trace loads any server with any tokenizer; the mix is what
makes the layouts differ: long prompts stall a colocated decode, short ones are cheaper to compute
on decode than to hand off (conditional disaggregation).

    python tools/make_code_assistant_trace.py
"""

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "disaggsdk" / "bench" / "traces" / "code_assistant.jsonl"
NUM_REQUESTS = 200


def main() -> None:
    rng = random.Random(2026)
    lines = []
    for _ in range(NUM_REQUESTS):
        if rng.random() < 0.65:
            row = {"kind": "chat", "input_len": rng.randint(96, 384), "output_len": rng.randint(24, 96)}
        else:
            row = {"kind": "edit", "input_len": rng.randint(768, 1536), "output_len": rng.randint(64, 160)}
        lines.append(json.dumps(row))
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} requests to {OUT}")


if __name__ == "__main__":
    main()
