"""Train a tiny catalog model on the stdlib corpus (dense Qwen3 and Qwen3-MoE so far).

    python -m tools.train_tiny.train qwen3-tiny --out checkpoints/qwen3-tiny --minutes 30

The model is transformers' own class for the catalog entry (so the checkpoint is a Hugging Face
checkpoint by construction), with the vocabulary of the trained tokenizer. Deterministic for a
seed: windows are drawn by a seeded generator. Resumable: the state (weights, optimizer, the
generator, the step, the loss log) is saved every `save_every` steps under OUT/train_state.pt
and picked up again by running the same command. Matmuls in bfloat16 autocast (this CPU has
AVX-512-BF16: 2.4x float32), master weights in float32. The checkpoint is saved in bfloat16
(half the size; `--save-dtype float32` for the master weights).

`deepseek-r1-tiny` also trains its MTP layer (`tools.train_tiny.mtp`) on the next-next token, as
DeepSeek-V3 does: loss = main + `MTP_LOSS_WEIGHT` x MTP (DeepSeek's lambda of its first phase).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from disaggsdk.bench import code_corpus as corpus
from tools.train_tiny.mtp import MTPLayer, mtp_loss
from tools.train_tiny.tokenizer import END_OF_TEXT, IM_END, VOCAB_SIZE, save_tokenizer_files, special_ids, train_tokenizer

HF_CONFIG = {"qwen3-tiny": "Qwen3Config", "qwen3-coder-tiny": "Qwen3MoeConfig", "deepseek-r1-tiny": "DeepseekV3Config"}
MTP_LOSS_WEIGHT = 0.3
# each schedule's length: what fits in ~30 minutes on the 2-core dev box (steps/s: dense 1.3,
# Qwen3-MoE 0.85, DeepSeek with its MTP layer 0.6)
MAX_STEPS = {"qwen3-tiny": 2_400, "qwen3-coder-tiny": 1_500, "deepseek-r1-tiny": 1_000}
STATE_FILE = "train_state.pt"
LOSS_LOG = "loss.jsonl"


@dataclass(frozen=True)
class TrainSettings:
    """What one run does (defaults: the shipped checkpoints)."""

    seq_len_tokens: int = 256
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    max_steps: int = 2_400  # the cosine schedule's length (`MAX_STEPS` per model from the command line)
    minutes: float = 30.0
    save_every: int = 200
    eval_every: int = 500
    seed: int = 0
    threads: int = 2


def token_stream(tok, files: list[corpus.CorpusFile], held_out: bool, root: Path | None = None) -> torch.Tensor:
    """Every file's tokens, end-of-text between files, as one int64 tensor."""
    eot = special_ids(tok)[END_OF_TEXT]
    ids: list[int] = []
    for text in corpus.texts(files, held_out, root):
        ids.extend(tok.encode(text).ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.int64)


def build_model(name: str, vocab_size: int, ids: dict[str, int], seed: int, **overrides):
    """transformers' model for catalog entry ``name`` with the trained tokenizer's vocabulary."""
    import transformers

    from disaggsdk.models import catalog_config

    if name not in HF_CONFIG:
        raise SystemExit(f"{name}: not trainable (only {', '.join(HF_CONFIG)})")
    fields = {**catalog_config(name), "vocab_size": vocab_size, "bos_token_id": None,
              "eos_token_id": ids[IM_END], "pad_token_id": ids[END_OF_TEXT], **overrides}
    config = getattr(transformers, HF_CONFIG[name])(**fields)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def add_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Rewrite the safetensors file at ``path`` with ``tensors`` added (the MTP layer's)."""
    from safetensors.torch import load_file, save_file

    merged = {**load_file(str(path)), **tensors}
    tmp = path.with_suffix(".tmp")
    save_file(merged, str(tmp), metadata={"format": "pt"})
    tmp.replace(path)


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warm-up, then cosine down to a tenth."""
    if step < s.warmup_steps:
        return s.learning_rate * (step + 1) / s.warmup_steps
    progress = min(1.0, (step - s.warmup_steps) / max(1, s.max_steps - s.warmup_steps))
    return s.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_at(stream: torch.Tensor, gen: torch.Generator, s: TrainSettings) -> torch.Tensor:
    """``batch_size`` random windows of ``seq_len_tokens + 1`` tokens."""
    starts = torch.randint(0, stream.numel() - s.seq_len_tokens - 1, (s.batch_size,), generator=gen)
    return torch.stack([stream[i : i + s.seq_len_tokens + 1] for i in starts.tolist()])


@torch.no_grad()
def held_out_bits_per_byte(model, stream: torch.Tensor, num_bytes: int, seq_len: int, autocast: bool = True) -> float:
    """Cross-entropy of the held-out stream in bits per byte of its text.

    Windows of ``seq_len + 1`` tokens that overlap by one, so every token but the first is scored
    exactly once (the first of each window with one token of context: a little pessimistic, as is
    scoring the end-of-text tokens, which have no bytes in ``num_bytes``). ``autocast``: matmuls in
    bfloat16, as in training; off, float32 throughout (the eval command).
    """
    model.eval()
    total_nats = 0.0
    for start in range(0, stream.numel() - 1, seq_len):
        window = stream[start : start + seq_len + 1]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(window[None, :-1]).logits.float()
        total_nats += torch.nn.functional.cross_entropy(logits[0], window[1:], reduction="sum").item()
    model.train()
    return total_nats / math.log(2) / num_bytes


def train(name: str, out: Path, s: TrainSettings, root: Path | None = None, max_files: int | None = None,
          vocab_size: int = VOCAB_SIZE, save_dtype: str = "bfloat16", **model_overrides) -> dict:
    """Train (or resume) ``name`` into ``out``; returns the final summary (also in OUT/train_summary.json).

    Args:
        root, max_files: the corpus (default: the whole stdlib) -- tests use a small one.
        vocab_size: the tokenizer's; model_overrides: config fields for tests (fewer layers).
    """
    torch.set_num_threads(s.threads)
    out.mkdir(parents=True, exist_ok=True)
    files = corpus.list_files(root)[:max_files]
    corpus.write_manifest(files, out / "corpus_manifest.json")
    tok_path = out / "tokenizer.json"
    if tok_path.exists():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_path))
    else:
        tok = train_tokenizer(corpus.texts(files, held_out=False, root=root), vocab_size)
        save_tokenizer_files(tok, out)
    train_ids = token_stream(tok, files, held_out=False, root=root)
    eval_ids = token_stream(tok, files, held_out=True, root=root)
    eval_bytes = sum(len(t.encode()) for t in corpus.texts(files, held_out=True, root=root))
    ids = special_ids(tok)
    model = build_model(name, tok.get_vocab_size(), ids, s.seed, **model_overrides)
    mtp = MTPLayer(model) if getattr(model.config, "num_nextn_predict_layers", 0) else None
    trained = torch.nn.ModuleList([model, *([mtp] if mtp else [])])
    trained.train()
    opt = torch.optim.AdamW(trained.parameters(), lr=s.learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(s.seed)
    step, log = 0, []
    state_path = out / STATE_FILE
    if state_path.exists():
        state = torch.load(state_path, weights_only=False)
        trained.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        step, log = state["step"], state["log"]

    def save_state() -> None:
        tmp = state_path.with_suffix(".tmp")
        torch.save({"model": trained.state_dict(), "optimizer": opt.state_dict(), "generator": gen.get_state(),
                    "step": step, "log": log}, tmp)
        tmp.replace(state_path)  # never a half-written state

    deadline = time.monotonic() + s.minutes * 60
    bar = tqdm(total=s.max_steps, initial=step, desc=name, unit="step")
    while step < s.max_steps and time.monotonic() < deadline:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s)
        batch = batch_at(train_ids, gen, s)
        record = {"step": step + 1}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if mtp is None:
                logits = model(batch[:, :-1]).logits
            else:
                hidden = model.model(batch[:, :-1]).last_hidden_state
                logits = model.lm_head(hidden)
                next_next_loss = mtp_loss(mtp, hidden, batch)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        record["loss"] = round(loss.item(), 4)
        if mtp is not None:
            record["mtp_loss"] = round(next_next_loss.item(), 4)
            loss = loss + MTP_LOSS_WEIGHT * next_next_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained.parameters(), 1.0)
        opt.step()
        step += 1
        record["lr"] = lr_at(step - 1, s)
        if step % s.eval_every == 0:
            record["held_out_bits_per_byte"] = round(held_out_bits_per_byte(model, eval_ids, eval_bytes, s.seq_len_tokens), 4)
        log.append(record)
        bar.update(1)
        bar.set_postfix(loss=record["loss"])
        if step % s.save_every == 0:
            save_state()
    bar.close()
    save_state()
    bpb = held_out_bits_per_byte(model, eval_ids, eval_bytes, s.seq_len_tokens)
    model.generation_config.eos_token_id = [ids[IM_END], ids[END_OF_TEXT]]
    model.generation_config.pad_token_id = ids[END_OF_TEXT]
    trained.to(getattr(torch, save_dtype))
    model.save_pretrained(out, safe_serialization=True)
    if mtp is not None:
        add_tensors(out / "model.safetensors", mtp.checkpoint_tensors())
    trained.to(torch.float32)
    save_tokenizer_files(tok, out)  # after save_pretrained: its generation_config.json is the same content
    (out / LOSS_LOG).write_text("".join(json.dumps(r) + "\n" for r in log))
    summary = {"model": name, "steps": step, "final_loss": log[-1]["loss"] if log else None,
               "held_out_bits_per_byte": round(bpb, 4), "train_tokens": int(train_ids.numel()),
               "tokens_seen": step * s.batch_size * s.seq_len_tokens}
    (out / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", choices=sorted(HF_CONFIG))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--minutes", type=float, default=TrainSettings.minutes)
    p.add_argument("--max-steps", type=int, help="default: MAX_STEPS of the model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=TrainSettings.threads)
    p.add_argument("--save-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    a = p.parse_args(argv)
    s = TrainSettings(minutes=a.minutes, max_steps=a.max_steps or MAX_STEPS[a.model], seed=a.seed, threads=a.threads)
    started = time.monotonic()
    summary = train(a.model, a.out, s, save_dtype=a.save_dtype)
    print(json.dumps({**summary, "wall_s": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main()
