"""Expert parallelism in deployments (issue 36): a prefill instance with its experts over its tp ranks
streams into a decode instance of lock-step dp ranks that share the experts, over the messenger
unchanged; colocated dp ranks too. Greedy tokens equal the plain engine's, MTP drafts are kept, every
page comes back, every rank's log says what its parameters hold, and no process outlives close()."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import attrs
import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.engine.tokenizer import load_tokenizer  # noqa: E402
from disaggsdk.serve.backends.local import serve_locally  # noqa: E402
from disaggsdk.spec.engine_settings import Speculative  # noqa: E402
from tests.launch._helpers import live_descendants, make_spec  # noqa: E402
from tests.launch.test_speculative_launch import MAX_TOKENS, PROMPTS, plain_tokens  # noqa: E402

HELD = re.compile(r"ep rank (\d+) of (\d+) holds routed experts \[([\d, ]*)\]")


def held_by_rank(log_dir: str) -> dict[tuple[str, int], list[int]]:
    """(unit, ep rank) -> the expert ids its parameters hold, from the units' logs."""
    out = {}
    for log in Path(log_dir).glob("*.log"):
        for m in HELD.finditer(log.read_text()):
            out[(log.stem, int(m[1]))] = [int(e) for e in m[3].split(",")]
    return out


@pytest.mark.parametrize("model,colocated", [
    ("deepseek-r1-tiny", False),
    pytest.param("qwen3-coder-tiny", True, marks=pytest.mark.slow),  # the engine tests hold lock-step parity too
], ids=["r1-mtp-P-tp2-ep2-D-dp2-ep2", "qwen-colocated-dp2-ep2"])
def test_expert_parallel_deployment_keeps_greedy_tokens(model, colocated, tmp_path):
    prompts = [load_tokenizer(model).encode(p) for p in PROMPTS]
    want = plain_tokens(model, prompts)
    spec = make_spec(model, prefill_tp=2, decode_dp=2, num_pages=128, budget=32)
    spec = attrs.evolve(spec, prefill=attrs.evolve(spec.prefill, ep=2), decode=attrs.evolve(spec.decode, ep=2))
    if model == "deepseek-r1-tiny":
        spec = attrs.evolve(spec, speculative=Speculative("mtp", 2))
    before = live_descendants()
    with serve_locally(spec, colocated=colocated, on_event=lambda _line: None, log_dir=str(tmp_path)) as rt:
        events = rt.generate_batch(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True), timeout_s=180)
        stats = rt.unit_stats()
    assert live_descendants() <= before, "a unit or tp worker outlived close()"
    assert [[t for e in ev for t in e.new_token_ids] for ev in events] == want
    decoding = [s for name, s in stats.items() if name.startswith("decode-0.dp")]
    assert len(decoding) == 2 and all(s.counters.spec_num_drafts or model != "deepseek-r1-tiny" for s in decoding)
    if model == "deepseek-r1-tiny":
        assert sum(s.counters.spec_num_accepted_tokens for s in decoding) > 0
    assert all(s.num_free_pages == s.num_pages for s in stats.values())
    # the exchange is counted where users read it (disaggsdk_expert_all_to_all_bytes_total); units of ep 1 send none
    assert all(s.counters.expert_all_to_all_bytes > 0 for s in decoding)
    # each rank's parameters hold only its half of the 8 routed experts
    held = held_by_rank(str(tmp_path))
    instances = [("decode-0.dp0", "decode-0.dp1")] + ([] if colocated else [("prefill-0",)])
    for units in instances:
        got = {rank: experts for (unit, rank), experts in held.items() if unit in units}
        assert got == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}, held


def test_r1_dp_tiny_serves_the_openai_client_with_every_rank_holding_only_its_experts(tmp_path):
    """The acceptance line: `disaggsdk launch specs/r1_dp.yaml --tiny` (prefill tp 8 ep 8, decode 8
    lock-step dp ranks ep 8) answers the openai client; each of the 16 ranks' parameters hold its one
    of deepseek-r1-tiny's 8 routed experts (their own report at start, not the plan's)."""
    import openai

    from tests.conftest import start_cli_server
    from tests.serve.test_launch_cli import descendants, reap, still_alive

    proc, url = start_cli_server("launch", "specs/r1_dp.yaml", "--tiny", "--port", "0", "--no-live",
                                 "--log-dir", str(tmp_path), timeout_s=300)
    kids: set[int] = set()
    try:
        kids = descendants(proc.pid)
        assert len(kids) >= 16  # 9 units (prefill + 8 dp ranks) and the prefill unit's 7 tp workers
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        answers = [client.completions.create(model=model, prompt=p, max_tokens=8, temperature=0.0)
                   for p in ("def fib(n):", "import os\n", "class Stack:")]
        assert all(a.choices[0].finish_reason in ("length", "stop") and a.usage.completion_tokens for a in answers)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 143, out  # terminated, after a clean shutdown of every lock-step rank
        assert not still_alive(kids)
    finally:
        reap(proc, kids)
    held = held_by_rank(str(tmp_path))
    prefill = {rank: e for (unit, rank), e in held.items() if unit == "prefill-0"}
    decode = {(unit, rank): e for (unit, rank), e in held.items() if unit.startswith("decode-0.dp")}
    assert prefill == {r: [r] for r in range(8)}, held
    assert decode == {(f"decode-0.dp{r}", r): [r] for r in range(8)}, held


def test_a_dead_dp_rank_restarts_with_its_whole_lock_step_group():
    """One rank of a dp 2 ep 2 decode instance SIGKILLed: the runtime stops its partner (it cannot step
    alone, and a lone newcomer cannot join its process group), starts both again at a new address, and
    the deployment serves the same greedy tokens."""
    from tests.launch.test_restart import wait_healthy_again

    model = "qwen3-coder-tiny"
    prompts = [load_tokenizer(model).encode(p) for p in PROMPTS[:3]]
    want = plain_tokens(model, prompts)
    spec = make_spec(model, decode_dp=2, provider="tcp", num_pages=128, budget=32)  # tcp: see test_lifecycle.py
    spec = attrs.evolve(spec, decode=attrs.evolve(spec.decode, ep=2))
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    before = live_descendants()
    with serve_locally(spec, on_event=lambda _line: None, max_restarts=2) as rt:
        units = rt.runtime.units
        old = {name: units[name].info.incarnation for name in ("decode-0.dp0", "decode-0.dp1")}
        address = units["decode-0.dp0"].args.group_address
        rt.runtime.kill_unit("decode-0.dp1")
        for name, incarnation in old.items():
            wait_healthy_again(rt, name, incarnation)
        new_address = units["decode-0.dp0"].args.group_address
        assert new_address == units["decode-0.dp1"].args.group_address and new_address != address
        assert any("stopped with its lock-step dp group: decode-0.dp1 died" in f for f in rt.runtime.failures)
        events = rt.generate_batch(prompts, params, timeout_s=120)
    assert live_descendants() <= before, "a unit or tp worker outlived close()"
    assert [[t for e in ev for t in e.new_token_ids] for ev in events] == want
