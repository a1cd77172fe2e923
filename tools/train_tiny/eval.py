"""Evaluate trained tiny checkpoints on the held-out corpus; prints one JSON document.

    python -m tools.train_tiny.eval                      # the three shipped checkpoints
    python -m tools.train_tiny.eval --model deepseek-r1-tiny --dir /tmp/ckpt/deepseek-r1-tiny

For each model: held-out bits per byte (transformers' forward in float32 over the checkpoint as
saved), for DeepSeek the MTP layer's top-1 agreement with the main model's greedy next-next token
(teacher-forced: at position i the MTP layer sees h_i and t_{i+1}; it agrees when its argmax equals
the main model's argmax at position i+1, which is what a speculative-decoding step accepts), our
engine's greedy output tokens/s, and one completion of "def fib(n):".
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from disaggsdk.bench import code_corpus as corpus
from tools.train_tiny.train import HF_CONFIG, held_out_bits_per_byte, token_stream

SAMPLE_PROMPT = "def fib(n):"
EVAL_SEQ_LEN_TOKENS = 256


@torch.no_grad()
def mtp_agreement(model, mtp, stream: torch.Tensor, seq_len: int) -> dict[str, float]:
    """The MTP layer's top-1 agreement with the main model's greedy next-next token, and its accuracy
    on the true next-next token, over ``stream`` in windows of ``seq_len + 1`` tokens."""
    agree = correct = total = 0
    for start in range(0, stream.numel() - 2, seq_len):
        window = stream[start : start + seq_len + 1]
        if window.numel() < 3:
            break
        tokens = window[None, :-1]
        hidden = model.model(tokens).last_hidden_state
        greedy = model.lm_head(hidden).argmax(-1)[0]  # greedy[j]: the main model's t_{j+1}
        positions = torch.arange(tokens.shape[1] - 1)[None]
        draft = mtp(hidden[:, :-1], tokens[:, 1:], positions).argmax(-1)[0]  # draft[i]: t_{i+2}
        agree += int((draft == greedy[1:]).sum())
        correct += int((draft == window[2:]).sum())
        total += draft.numel()
    return {"mtp_top1_agreement": round(agree / total, 4), "mtp_top1_accuracy": round(correct / total, 4),
            "mtp_positions": total}


def engine_tokens_per_s(model: str, prompts: list[list[int]], max_tokens: int) -> float:
    """Output tokens/s of our engine generating greedily for ``prompts`` (one batch, float32)."""
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams

    with LLMEngine(model, EngineConfig(num_pages=512)) as engine:
        engine.generate(prompts[:1], SamplingParams(max_tokens=2))  # first-call costs out of the timing
        started = time.perf_counter()
        outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        elapsed = time.perf_counter() - started
    return sum(len(o.output_ids) for o in outs) / elapsed


def sample_completion(model: str, max_tokens: int = 48) -> str:
    """Our engine's greedy completion of `SAMPLE_PROMPT`."""
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.engine.tokenizer import load_tokenizer

    tok = load_tokenizer(model)
    with LLMEngine(model, EngineConfig(num_pages=64, compile=False)) as engine:
        out = engine.generate([tok.encode(SAMPLE_PROMPT)], SamplingParams(max_tokens=max_tokens))[0]
    return SAMPLE_PROMPT + tok.decode(out.output_ids)


def evaluate(name: str, directory: Path, engine_model: str, threads: int = 2) -> dict:
    """Every figure of one checkpoint (see the module docstring)."""
    import transformers
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    torch.set_num_threads(threads)
    manifest = json.loads((directory / "corpus_manifest.json").read_text())
    files = corpus.list_files()
    if corpus.manifest(files)["sha256"] != manifest["sha256"]:
        raise SystemExit(f"{directory}: trained on another corpus (this interpreter's stdlib differs)")
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    eval_ids = token_stream(tok, files, held_out=True)
    eval_bytes = sum(len(t.encode()) for t in corpus.texts(files, held_out=True))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    result = {"model": name, "directory": str(directory), "held_out_tokens": int(eval_ids.numel()),
              "held_out_bits_per_byte": round(held_out_bits_per_byte(model, eval_ids, eval_bytes,
                                                                     EVAL_SEQ_LEN_TOKENS, autocast=False), 4)}
    if getattr(model.config, "num_nextn_predict_layers", 0):
        from tools.train_tiny.mtp import load_mtp

        mtp = load_mtp(model, load_file(str(directory / "model.safetensors"))).eval()
        result.update(mtp_agreement(model, mtp, eval_ids, EVAL_SEQ_LEN_TOKENS))
    prompts = [eval_ids[i * 1000 : i * 1000 + 64].tolist() for i in range(8)]
    result["engine_output_tokens_per_s"] = round(engine_tokens_per_s(engine_model, prompts, 64), 1)
    result["sample"] = sample_completion(engine_model)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", choices=sorted(HF_CONFIG), help="default: all three")
    p.add_argument("--dir", type=Path, help="a checkpoint directory (default: the shipped one); one --model")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    from disaggsdk.models.shipped import shipped_checkpoint

    names = a.model or sorted(HF_CONFIG)
    if a.dir and len(names) != 1:
        p.error("--dir evaluates one checkpoint: name its --model")
    results = []
    for name in names:
        directory = a.dir or shipped_checkpoint(name)
        if directory is None:
            p.error(f"{name}: no shipped checkpoint; train one (python -m tools.train_tiny.train {name} --out DIR)")
        results.append(evaluate(name, directory, str(directory) if a.dir else name, a.threads))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
