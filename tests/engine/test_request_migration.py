"""Moving a decoding request between two engines (`LLMEngine.suspend` / `add_migrated_request`):
with its pages' bytes copied and its state carried as the wire carries it (msgspec), it continues
exactly: greedy tokens and seeded samples equal an unmoved run, for GQA (Qwen3-MoE) and MLA with
MTP drafting (DeepSeek), with a grammar active; a request that is not decoding refuses to move, and
resuming in place or releasing leaves every page back."""

from __future__ import annotations

import msgspec
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llguidance")

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.request_migration import MigrationError, RunningRequestState  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.engine.speculative.config import SpeculativeConfig  # noqa: E402
from disaggsdk.engine.structured.output import StructuredOutput  # noqa: E402
from disaggsdk.engine.tokenizer import load_tokenizer  # noqa: E402

CONFIG = dict(num_pages=96, page_size=4, max_num_batched_tokens=32)
PROMPTS = ["def fib(n):", "class Stack:\n    def __init__(self):", "# a JSON record\nrecord = "]
MAX_TOKENS = 24
MOVE_AFTER_STEPS = 7  # decode steps on the first engine before the move


def params_for(i: int, structured: bool) -> SamplingParams:
    if structured:
        return SamplingParams(max_tokens=MAX_TOKENS, structured=StructuredOutput("regex", r"[a-z]{3,8}_[0-9]{2,30}"))
    if i == 1:  # seeded sampling: the generator's state moves with the request
        return SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.8, seed=11)
    return SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


def copy_pages(src: LLMEngine, dst: LLMEngine, src_pages: list[int], dst_pages: list[int]) -> None:
    """Copy whole pages of every cache layer, as the fabric's writes do."""
    fmt = src.kv.cache.fmt
    assert dst.kv.cache.fmt.page_bytes == fmt.page_bytes and dst.kv.cache.fmt.num_layers == fmt.num_layers
    a = src.kv.cache.buffer.view(torch.uint8).view(fmt.num_layers, fmt.num_pages, fmt.page_bytes)
    b = dst.kv.cache.buffer.view(torch.uint8).view(fmt.num_layers, dst.kv.cache.fmt.num_pages, fmt.page_bytes)
    b[:, dst_pages] = a[:, src_pages]


def run_to_end(engine: LLMEngine, rids: list[str]) -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.output_ids
    assert set(done) == set(rids)
    return done


@pytest.mark.parametrize("model,spec,structured", [
    ("qwen3-coder-tiny", None, False),
    ("deepseek-r1-tiny", SpeculativeConfig("mtp", 1), False),
    ("deepseek-r1-tiny", SpeculativeConfig("mtp", 1), True),
], ids=["gqa", "mla-mtp", "mla-mtp-grammar"])
def test_moved_requests_continue_exactly(model, spec, structured):
    tok = load_tokenizer(model)
    prompts = [tok.encode(p) for p in PROMPTS]
    params = [params_for(i, structured) for i in range(len(prompts))]
    rids = [f"r{i}" for i in range(len(prompts))]
    config = EngineConfig(**CONFIG, speculative=spec)
    with LLMEngine(model, config) as unmoved:
        for rid, p, sp in zip(rids, prompts, params):
            unmoved.add_request(rid, p, sp)
        want = run_to_end(unmoved, rids)
    with LLMEngine(model, config) as a, LLMEngine(model, config) as b:
        for rid, p, sp in zip(rids, prompts, params):
            a.add_request(rid, p, sp)
        steps = 0
        while steps < MOVE_AFTER_STEPS or any(a.scheduler.find(r).num_computed_tokens < len(p) for r, p in zip(rids, prompts)):
            a.step()
            steps += 1
        for rid in rids:
            state = a.kv.suspend(rid)
            wire = msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=RunningRequestState)
            src_pages = a.kv.page_ids(rid)
            assert len(src_pages) == wire.num_pages(config.page_size)
            grant = b.kv.allocate_pages(rid, wire.num_computed_tokens)
            copy_pages(a, b, src_pages, list(grant.page_ids))
            b.kv.add_migrated_request(wire)
            assert a.kv.release_suspended(rid) == len(src_pages)
        assert a.kv.num_free_pages == CONFIG["num_pages"] and not a.has_unfinished()
        got = run_to_end(b, rids)
        assert b.kv.num_free_pages == CONFIG["num_pages"]
    assert got == want


def test_a_request_that_is_not_decoding_does_not_move_and_resume_puts_it_back():
    model = "qwen3-coder-tiny"
    tok = load_tokenizer(model)
    prompt = tok.encode(PROMPTS[1])
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    with LLMEngine(model, EngineConfig(**CONFIG)) as unmoved:
        want = unmoved.generate([prompt], sp)[0].output_ids
    with LLMEngine(model, EngineConfig(**{**CONFIG, "max_num_batched_tokens": 4})) as engine:
        engine.add_request("r", prompt, sp)
        with pytest.raises(MigrationError, match="not decoding"):
            engine.kv.suspend("r")  # queued: no KV yet
        engine.step()  # a 4-token chunk of its prompt
        with pytest.raises(MigrationError, match="not decoding"):
            engine.kv.suspend("r")
        with pytest.raises(MigrationError, match="not running"):
            engine.kv.suspend("nobody")
        while not engine.scheduler.find("r").output_ids:
            engine.step()
        engine.kv.suspend("r")
        assert engine.kv.suspended == ["r"] and not engine.has_unfinished()
        assert engine.step() == []  # a suspended request is not scheduled
        assert engine.kv.resume("r") and not engine.kv.resume("r")
        out = run_to_end(engine, ["r"])
        assert engine.kv.num_free_pages == CONFIG["num_pages"]
    assert out["r"] == want


def test_admitting_a_moved_request_checks_its_pages():
    model = "qwen3-coder-tiny"
    with LLMEngine(model, EngineConfig(**CONFIG)) as engine:
        state = RunningRequestState("m", [1, 2, 3, 4, 5, 6], [7, 8], SamplingParams(max_tokens=4), num_computed_tokens=7)
        with pytest.raises(MigrationError, match="pages granted"):
            engine.kv.add_migrated_request(state)
        engine.kv.allocate_pages("m", 7)
        engine.kv.add_migrated_request(state)
        with pytest.raises(MigrationError, match="already running"):
            engine.kv.add_migrated_request(state)
        assert engine.abort("m") and engine.kv.num_free_pages == CONFIG["num_pages"]
