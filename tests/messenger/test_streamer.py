"""The layer streamer against a real `LayerCounter` driven by the test: writes follow the layers."""

from __future__ import annotations

import threading
import time

from disaggsdk.engine.layer_counter.host import LayerCounter
from disaggsdk.messenger.streamer import LayerStreamer, StepWork


def wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the streamer did not get there"
        time.sleep(0.005)


def make(num_layers: int = 3):
    counter, log, lock = LayerCounter(), [], threading.Lock()

    def submit(items, layer):
        with lock:
            log.append(("layer", tuple(items), layer))

    def finish(items):
        with lock:
            log.append(("finish", tuple(items)))

    return counter, log, LayerStreamer(counter, num_layers, submit, finish, name="test-streamer")


def test_a_layer_is_submitted_only_once_the_forward_pass_finished_it():
    counter, log, streamer = make()
    try:
        streamer.put(StepWork(1, ["a"]))
        time.sleep(0.05)
        assert log == []  # the step has not begun: nothing may be written yet
        counter.begin_step()
        counter.on_layer_done(0)
        wait_for(lambda: len(log) == 1)
        time.sleep(0.05)
        assert log == [("layer", ("a",), 0)]  # layer 1 is not done: it waits
        counter.on_layer_done(1)
        counter.on_layer_done(2)
        wait_for(lambda: len(log) == 4)
        assert log[1:] == [("layer", ("a",), 1), ("layer", ("a",), 2), ("finish", ("a",))]
    finally:
        streamer.close()


def test_steps_stream_in_order_and_a_later_step_releases_an_earlier_one():
    counter, log, streamer = make(num_layers=2)
    try:
        streamer.put(StepWork(1, ["s1"]))
        streamer.put(StepWork(2, ["s2"]))
        counter.begin_step()
        counter.begin_step()  # step 2 began: step 1 must be complete, all of it may go
        counter.on_layer_done(1)
        wait_for(lambda: len(log) == 6)
        assert [e[1] for e in log] == [("s1",)] * 3 + [("s2",)] * 3
        assert [e[0] for e in log] == ["layer", "layer", "finish"] * 2
    finally:
        streamer.close()


def test_close_stops_a_streamer_that_waits_for_a_layer():
    counter, log, streamer = make()
    streamer.put(StepWork(1, ["never"]))
    t0 = time.monotonic()
    streamer.close()
    assert not streamer._thread.is_alive() and time.monotonic() - t0 < 5
    assert log == []
