"""The device layer counter against its CPU twin: the same [step_id, layers_done] for the same step.

On a CPU the device counter runs over plain CPU memory (its op writes the very tensor the readers
read), which checks everything but the mapping: the step ordering, the seqlock read, the polling
wait. The `gpu` tests put its memory in pinned host memory mapped into the GPU and bump it from a
CUDA graph's replay.
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch  # noqa: E402
from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.layer_counter import new_layer_counter  # noqa: E402
from disaggsdk.engine.layer_counter.base import AnyLayerCounter  # noqa: E402
from disaggsdk.engine.layer_counter.device import DeviceLayerCounter, mapped_view  # noqa: E402
from disaggsdk.engine.layer_counter.host import LayerCounter  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from tests.declared_skips import no_gpu  # noqa: E402

MODEL = "qwen3-tiny"
HAVE_CUDA = torch.cuda.is_available()


def cpu_device_counter() -> DeviceLayerCounter:
    memory = torch.zeros(2, dtype=torch.int64)
    return DeviceLayerCounter(memory, memory)


def recording(counter: AnyLayerCounter, seen: list[tuple[int, int]]):
    """``counter.on_layer_done`` that also records what ``read`` gives right after each layer."""

    def on_layer_done(layer_id: int, output: torch.Tensor) -> None:
        counter.on_layer_done(layer_id, output)
        seen.append(counter.read())

    return on_layer_done


def test_both_counters_are_layer_counters_and_a_cpu_engine_keeps_the_cpu_one():
    assert isinstance(LayerCounter(), AnyLayerCounter)
    assert isinstance(cpu_device_counter(), AnyLayerCounter)
    assert type(new_layer_counter(torch.device("cpu"))) is LayerCounter
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=16)) as engine:
        assert type(engine.layer_counter) is LayerCounter


def test_device_counter_needs_cuda_and_pinned_memory():
    with pytest.raises(ValueError, match="pinned"):
        mapped_view(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="view of host_values"):
        DeviceLayerCounter(torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
    if not HAVE_CUDA:
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            DeviceLayerCounter.on_device("cuda")


def test_device_counter_follows_the_cpu_twin_over_an_eager_cpu_step():
    """The eager CPU model bumps either counter after each layer: both read the same sequence."""
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=16)) as engine:
        runner = engine.runner
        sequences = []
        for counter in (LayerCounter(), cpu_device_counter()):
            seen: list[tuple[int, int]] = []
            for _ in range(2):
                step_id = counter.begin_step()
                assert counter.read() == (step_id, 0)
                items = [BatchItem([3, 4, 5], 0, [0]), BatchItem([7], 0, [1])]
                runner.run(build_forward_batch(items, 4, "cpu", recording(counter, seen)))
                assert counter.values.tolist() == [step_id, engine.arch.num_layers]
                assert counter.wait(step_id, engine.arch.num_layers, timeout_s=0)
                assert counter.wait(step_id - 1, engine.arch.num_layers + 1, timeout_s=0)  # a later step began
                assert not counter.wait(step_id + 1, 1, timeout_s=0.01)
            sequences.append(seen)
        layers = engine.arch.num_layers
        assert sequences[0] == sequences[1] == [(s, n) for s in (1, 2) for n in range(1, layers + 1)]


def test_device_counter_wakes_a_polling_waiter_layer_by_layer():
    """The streamer's pattern: a thread waits for layer 1, 2, ... of a step another thread bumps."""
    counter = cpu_device_counter()
    num_layers, reached = 4, []
    step_id = counter.begin_step()
    layer_done = [threading.Event() for _ in range(num_layers)]

    def stream():
        for layer in range(num_layers):
            if not counter.wait(step_id, layer + 1, timeout_s=10):
                return  # `reached` comes up short
            reached.append(counter.read())
            layer_done[layer].set()

    thread = threading.Thread(target=stream)
    thread.start()
    for layer in range(num_layers):
        counter.on_layer_done(layer)
        assert layer_done[layer].wait(10)  # one layer at a time: the waiter sees each count
    thread.join(10)
    assert reached == [(step_id, n) for n in range(1, num_layers + 1)]


def test_device_counter_never_pairs_a_new_step_with_the_old_count():
    """begin_step resets the count before the id: between the two writes a reader sees the old step
    with no layers, never the new step with the old step's layers."""
    counter = cpu_device_counter()
    counter.begin_step()
    for layer in range(3):
        counter.on_layer_done(layer)
    writes = []
    original = counter._step_cell.fill_

    class Spy:
        def fill_(self, value):
            writes.append(counter._host.tolist())
            return original(value)

    counter._step_cell = Spy()
    assert counter.begin_step() == 2
    assert writes == [[1, 0]]  # when the id was written the count was already 0
    assert counter.read() == (2, 0)


# --- GPU: pinned host memory written by a CUDA graph's replay ---------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_CUDA, reason=no_gpu("needs an NVIDIA GPU"))
def test_mapped_view_aliases_pinned_host_memory():
    counter = DeviceLayerCounter.on_device("cuda")
    assert counter.values.device.type == "cuda" and counter.values.data_ptr() == counter.host_values.data_ptr()
    step_id = counter.begin_step()
    counter.on_layer_done(6)
    torch.cuda.synchronize()
    assert counter.host_values.tolist() == [step_id, 7] and counter.read() == (step_id, 7)


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_CUDA, reason=no_gpu("needs an NVIDIA GPU"))
def test_counter_bumped_inside_a_cuda_graph_is_read_by_a_polling_thread_as_the_cpu_twin_counts():
    """A graph of the model's layers with the counter's fills captured in it: each replay, a polling
    thread waits for every layer of the step in turn, and the final counts equal the CPU twin's
    for the same eager step on the CPU model."""
    num_layers = 6
    weights = [torch.randn(256, 256, device="cuda") / 16 for _ in range(num_layers)]
    counter = DeviceLayerCounter.on_device("cuda")
    x = torch.randn(8, 256, device="cuda")

    def forward(on_layer_done):
        h = x
        for layer, w in enumerate(weights):
            h = torch.tanh(h @ w)
            on_layer_done(layer, h)
        return h

    forward(counter.on_layer_done)  # warm-up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward(counter.on_layer_done)

    def poll(step_id: int, seen: list[tuple[int, int]]) -> None:
        for layer in range(num_layers):
            if not counter.wait(step_id, layer + 1, timeout_s=30):
                return  # the comparison below fails with what was seen
            seen.append(counter.read())

    cpu_twin = LayerCounter()
    for _ in range(3):
        step_id, cpu_step = counter.begin_step(), cpu_twin.begin_step()
        seen: list[tuple[int, int]] = []
        thread = threading.Thread(target=poll, args=(step_id, seen))
        thread.start()
        graph.replay()
        thread.join(60)
        torch.cuda.synchronize()
        cpu_seen: list[tuple[int, int]] = []
        for layer in range(num_layers):
            cpu_twin.on_layer_done(layer)
            cpu_seen.append(cpu_twin.read())
        assert step_id == cpu_step
        assert [step for step, _ in seen] == [step_id] * num_layers
        assert all(n >= layer + 1 for layer, (_, n) in enumerate(seen))  # never behind what was waited for
        assert counter.read() == cpu_twin.read() == (step_id, num_layers) == cpu_seen[-1]
        assert counter.host_values.tolist() == cpu_twin.values.tolist()
