"""Closed-loop load (`workload.ClosedLoop`): N clients, each sending its next request when its previous one finished;
and what such load meets in a colocated instance: a step that carries a prompt's chunk is one composed step, so the
decodes in it wait for the prompt."""

import attrs
import pytest

from disaggsdk.sim.hardware import load_profile
from disaggsdk.sim.instance import RequestRecord, SimInstance
from disaggsdk.sim.simulator import SimConfig, Simulation
from disaggsdk.sim.step_batch import StepBatch
from disaggsdk.sim.workload import ClosedLoop, SimRequest, WorkloadError
from disaggsdk.spec import load_spec

H200 = load_profile("h200")
R1_TP = load_spec("specs/r1_tp.yaml")


def in_flight_at_most(records: list[RequestRecord]) -> int:
    """The most requests sent and not finished at any moment (a finish at the moment of a send counts first:
    the finished request's client sends then)."""
    events = sorted([(r.request.arrival_s, 1) for r in records] + [(r.finish_s, -1) for r in records])
    most = count = 0
    for _, change in events:
        count += change
        most = max(most, count)
    return most


def assert_each_client_sends_when_its_last_finished(records: list[RequestRecord], concurrency: int) -> None:
    by_client: dict[int, list[RequestRecord]] = {}
    for record in records:
        assert record.request.client_id is not None and 0 <= record.request.client_id < concurrency
        by_client.setdefault(record.request.client_id, []).append(record)
    assert sorted(by_client) == list(range(concurrency))
    for mine in by_client.values():
        mine.sort(key=lambda r: r.request.arrival_s)
        assert mine[0].request.arrival_s == 0.0
        for previous, following in zip(mine, mine[1:]):
            assert previous.finish_s > previous.request.arrival_s
            assert following.request.arrival_s == previous.finish_s  # the moment its last token came


@pytest.mark.parametrize("colocated", [False, True], ids=["disaggregated", "colocated"])
def test_a_closed_loop_holds_its_clients_in_flight_and_no_more(colocated):
    load = ClosedLoop(concurrency=6, num_requests=40, input_len=2048, output_len=64, range_ratio=0.5, seed=2)
    sim = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", colocated=colocated))
    result = sim.run(load)
    records = sim.requests_sent
    assert result["completed"] == len(records) == 40 and result["failed"] == 0
    assert result["max_concurrency"] == 6
    assert in_flight_at_most(records) == 6  # reached, never passed
    assert_each_client_sends_when_its_last_finished(records, 6)
    assert [r.request.input_len for r in records] == [r.input_len for r in load.requests()]  # drawn in send order


def test_a_client_waits_for_its_last_token_where_a_front_end_delivers_it():
    """On a CPU machine tokens reach the client after the server's (and the client's own) CPU work; the next
    request goes out when the last token arrives there, not when the engine computed it."""
    cpu = attrs.evolve(load_profile("h100"), frontend_cpu_ms_per_token=0.5, client_cpu_ms_per_token=0.5)
    sim = Simulation(load_spec("specs/tiny_local.yaml"),
                     SimConfig(cpu, colocated=True, shared_cores=2, client_shares_cores=True))
    result = sim.run(ClosedLoop(concurrency=3, num_requests=12, input_len=256, output_len=8))
    assert result["completed"] == 12 and in_flight_at_most(sim.requests_sent) == 3
    assert_each_client_sends_when_its_last_finished(sim.requests_sent, 3)


def test_one_client_sends_its_requests_back_to_back_by_hand():
    """One client, three requests of one shape, disaggregated: each starts when the one before it finished and
    sees the idle deployment the first one saw, so each takes one single request's end-to-end latency."""
    n_in, n_out = 2049, 5
    alone = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8"))
    single_s = alone.run([SimRequest(0, 0.0, n_in, n_out)])["mean_e2el_ms"] / 1e3
    sim = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8"))
    result = sim.run(ClosedLoop(concurrency=1, num_requests=3, input_len=n_in, output_len=n_out))
    assert [r.request.arrival_s for r in sim.requests_sent] == pytest.approx([0.0, single_s, 2 * single_s])
    assert [r.finish_s for r in sim.requests_sent] == pytest.approx([single_s, 2 * single_s, 3 * single_s])
    assert result["duration"] == pytest.approx(3 * single_s)
    assert result["output_throughput"] == pytest.approx(3 * n_out / (3 * single_s))


def test_closed_loop_draws_lengths_and_names_its_first_clients():
    load = ClosedLoop(concurrency=3, num_requests=50, input_len=1000, output_len=100, range_ratio=0.5, seed=4)
    requests = load.requests()
    assert [r.request_id for r in requests] == list(range(50))
    assert [r.client_id for r in requests[:4]] == [0, 1, 2, None]  # the rest go to whichever client is free
    assert all(500 <= r.input_len <= 1500 and 50 <= r.output_len <= 150 for r in requests)
    assert len({r.input_len for r in requests}) > 1 and requests == load.requests()
    for bad in (ClosedLoop(0, 5), ClosedLoop(2, 0), ClosedLoop(2, 5, input_len=1)):
        with pytest.raises(WorkloadError, match="concurrency >= 1, num_requests >= 1"):
            bad.requests()


def test_a_colocated_step_carrying_a_prompt_holds_its_decodes_for_the_composed_step():
    """In a mixed instance a step that carries a prefill chunk is priced as one step of decodes and chunk
    together (the engine's composed step), and the decodes in it get their token only when it ends."""
    sim = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", colocated=True))
    mixed: SimInstance = sim.decode[0]
    cost = mixed.cost
    first = RequestRecord(SimRequest(0, 0.0, 1000, 50))
    mixed.admit_prefill(first)
    dt, chunks = mixed.plan_step(0.0)
    mixed.finish_step(chunks, dt, dt)  # its prompt done: it decodes from here
    dt, chunks = mixed.plan_step(dt)
    decode_alone_s = cost.batch_time_s(StepBatch(1, 1001))
    assert dt == pytest.approx(decode_alone_s) and not chunks
    mixed.finish_step(chunks, dt, dt)
    mixed.admit_prefill(RequestRecord(SimRequest(1, 0.0, 4000, 50)))
    dt, chunks = mixed.plan_step(0.0)
    composed_s = cost.batch_time_s(StepBatch(1, 1002, chunks=((4000, 0),)))
    assert [n for _, n in chunks] == [4000] and dt == pytest.approx(composed_s)
    prefill_alone_s = cost.batch_time_s(StepBatch(chunks=((4000, 0),)))
    assert composed_s >= prefill_alone_s > 5 * decode_alone_s  # the decode waits out the prompt
    mixed.finish_step(chunks, dt, dt)
    assert mixed.itl_ms[-1] == pytest.approx(composed_s * 1e3)  # the running decode's gap between tokens

