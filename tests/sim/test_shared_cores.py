"""Processor sharing of a CPU machine's cores and the FIFO front-end stages that run on them."""

import pytest

from disaggsdk.sim.front_end import FrontEnd
from disaggsdk.sim.shared_cores import SharedCores


class EventLoop:
    """A minimal simulator: completes the earliest current job, hands front-end jobs to the stages."""

    def __init__(self, cores: SharedCores):
        self.cores, self.events = cores, []

    def reschedule(self, now_s: float) -> None:
        import heapq

        for event in self.cores.completions(now_s):
            heapq.heappush(self.events, event)

    def run(self, front: FrontEnd) -> None:
        import heapq

        while self.events:
            now_s, key, version = heapq.heappop(self.events)
            if self.cores.is_current(key, version):
                self.cores.finish(key, now_s)
                front.job_done(key[1], now_s)


def test_rate_counts_jobs_and_background_demand():
    cores = SharedCores(2)
    assert cores.rate() == 1.0
    cores.add_work("a", 1.0, 0.0)
    cores.add_work("b", 1.0, 0.0)
    assert cores.rate() == 1.0  # two jobs, two cores
    cores.set_background(0.5, 0.0)
    assert cores.rate() == pytest.approx(2 / 2.5)
    cores.add_work("c", 1.0, 0.0)
    assert cores.rate() == pytest.approx(2 / 3.5)
    with pytest.raises(ValueError, match="at least 1"):
        SharedCores(0)


def test_work_is_conserved_and_a_late_job_slows_the_running_one():
    cores = SharedCores(1)
    cores.add_work("a", 2.0, 0.0)
    first = cores.completions(0.0)
    assert first == [(2.0, "a", 1)]
    cores.add_work("b", 1.0, 1.0)  # a has 1 s left; both now run at half speed
    times = {key: at for at, key, _ in cores.completions(1.0)}
    assert times == {"a": pytest.approx(3.0), "b": pytest.approx(3.0)}
    assert not cores.is_current("a", first[0][2])  # the first estimate went stale


def test_a_finished_key_never_matches_an_event_of_its_previous_job():
    """Versions keep counting across jobs of one key: a stale event cannot end the next job early."""
    cores = SharedCores(1)
    cores.add_work("a", 1.0, 0.0)
    stale = cores.completions(0.0)[0]
    cores.add_work("b", 1.0, 0.0)
    current = {key: (at, v) for at, key, v in cores.completions(0.0)}
    cores.finish("a", current["a"][0])
    cores.add_work("a", 1.0, current["a"][0])  # the same key starts a new job
    cores.completions(current["a"][0])
    assert not cores.is_current("a", stale[2])


def test_front_end_stages_are_fifo_and_items_pass_them_in_order():
    cores = SharedCores(1)
    loop = EventLoop(cores)
    front = FrontEnd(cores, loop.reschedule)
    done = []
    front.submit([("server", 1.0), ("client", 0.5)], lambda at_s: done.append(("x", at_s)), 0.0)
    front.submit([("server", 1.0)], lambda at_s: done.append(("y", at_s)), 0.0)
    front.submit([("server", 0.0)], lambda at_s: done.append(("free", at_s)), 0.0)  # no work: no wait
    assert done == [("free", 0.0)]
    loop.run(front)
    # x leaves the server at 1; then the server (y) and the client (x) share the core until 2,
    # when x's client work (0.5 s at half speed) ends as y is half done; y alone ends at 2.5
    assert done[1:] == [("x", pytest.approx(2.0)), ("y", pytest.approx(2.5))]
    assert front.idle
