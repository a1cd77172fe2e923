"""Helpers for the launch tests: transformers' greedy reference, specs, leak checks (checkpoints: tests/hf_checkpoints.py)."""

from __future__ import annotations

import os

import attrs

from disaggsdk.spec import load_spec

TOP = 5


def hf_greedy(model, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    """transformers' greedy tokens and top-5 ids per step."""
    import torch

    tokens, tops = [], []
    with torch.no_grad():
        for p in prompts:
            out = model.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=258,
                                 return_dict_in_generate=True, output_scores=True)
            tokens.append(out.sequences[0, len(p):].tolist())
            tops.append([s[0].topk(TOP).indices.tolist() for s in out.scores])
    return tokens, tops


def check_against_hf(ref_tokens, ref_tops, got_tokens, got_tops) -> None:
    """Exact match, or a first difference that is a near-tie, in at most one prompt of eight."""
    differing = []
    for i, (want, got) in enumerate(zip(ref_tokens, got_tokens)):
        if want == got:
            continue
        j = next(k for k, (a, b) in enumerate(zip(want, got)) if a != b)
        assert got[j] in ref_tops[i][j] and want[j] in got_tops[i][j], (
            f"prompt {i}: token {j} is {got[j]} but transformers gives {want[j]} (not a near-tie)")
        differing.append(i)
    assert len(differing) <= 1, f"near-ties in prompts {differing}: more than one"


def make_spec(model: str, prefill_tp: int = 1, decode_tp: int = 1, decode_dp: int = 1, provider: str = "shm",
              prefill_replicas: int = 1, decode_replicas: int = 1, streaming: bool = True, deadline_s: float = 30.0,
              num_pages: int = 64, budget: int = 12, page_size: int = 4, layout: str = "HND",
              verify_pages: bool = False, kv_staging: str = "auto"):
    """The tiny_local spec reshaped for one test case (CPU, float32 KV)."""
    spec = load_spec(os.path.join(os.path.dirname(__file__), "..", "..", "specs", "tiny_local.yaml"))
    return attrs.evolve(
        spec, model=model,
        prefill=attrs.evolve(spec.prefill, tp=prefill_tp, replicas=prefill_replicas),
        decode=attrs.evolve(spec.decode, tp=decode_tp, dp=decode_dp, replicas=decode_replicas),
        kv=attrs.evolve(spec.kv, page_size=page_size, layout=layout),
        transport=attrs.evolve(spec.transport, provider=provider, verify_pages=verify_pages, kv_staging=kv_staging),
        transfer=attrs.evolve(spec.transfer, streaming=streaming, deadline_s=deadline_s),
        engine=attrs.evolve(spec.engine, num_pages=num_pages, max_num_batched_tokens=budget),
    )


def child_pids(root: int | None = None) -> set[int]:
    """Every descendant process of ``root`` (this process when None), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [root or os.getpid()]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def live_descendants() -> set[int]:
    """Descendants that are not zombies, multiprocessing's resource tracker aside (it lives as
    long as this process, whoever started it)."""
    live = set()
    for pid in child_pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                tracker = b"resource_tracker" in f.read()
        except OSError:
            continue
        if not zombie and not tracker:
            live.add(pid)
    return live


def serve_and_generate(spec, prompts: list[list[int]], params, timeout_s: float = 120):
    """Serve ``spec`` locally, generate ``prompts`` as one batch, close: the tokens each request got and the
    units' stats, after checking every request ran to its length and no unit or tp worker outlived close()."""
    from disaggsdk.serve.backends.local import serve_locally

    before = live_descendants()
    with serve_locally(spec, on_event=lambda _line: None) as rt:
        events = rt.generate_batch(prompts, params, timeout_s=timeout_s)
        stats = rt.unit_stats()
    assert live_descendants() <= before, "a unit or tp worker outlived close()"
    assert all(ev[-1].finish_reason == "length" for ev in events), [ev[-1].error for ev in events]
    return events, [[t for e in ev for t in e.new_token_ids] for ev in events], stats
