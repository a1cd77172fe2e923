"""CUDA-graph decode steps: the padding arithmetic (any device), and on a GPU the replayed step
against the eager CUDA step and the CPU engine, its layer counter against the CPU twin's."""

from __future__ import annotations

import queue
import threading

import pytest

torch = pytest.importorskip("torch")


from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch  # noqa: E402
from disaggsdk.engine.compiled_step.cuda_graphs import (  # noqa: E402
    MAX_GRAPH_BATCH_SIZE,
    CudaGraphStep,
    capture_batch_sizes,
    is_capturable_counter,
    pad_decode_batch,
    padded_batch_size,
)
from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.layer_counter.device import DeviceLayerCounter  # noqa: E402
from disaggsdk.engine.layer_counter.host import LayerCounter  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from tests.declared_skips import no_gpu  # noqa: E402

MODEL = "qwen3-tiny"
# on a GPU, flashinfer missing is a failure (the backend says what to install), not a skip
HAVE_GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason=no_gpu("needs an NVIDIA GPU (and flashinfer-python)"))


def test_capture_sizes_are_powers_of_two_then_the_cap():
    assert capture_batch_sizes(1) == (1,)
    assert capture_batch_sizes(64) == (1, 2, 4, 8, 16, 32, 64)
    assert capture_batch_sizes(48) == (1, 2, 4, 8, 16, 32, 48)
    assert capture_batch_sizes(10**6)[-1] == MAX_GRAPH_BATCH_SIZE
    with pytest.raises(ValueError, match=">= 1"):
        capture_batch_sizes(0)


def test_a_batch_replays_the_smallest_captured_size_that_holds_it():
    sizes = capture_batch_sizes(48)
    assert [padded_batch_size(n, sizes) for n in (1, 2, 3, 5, 17, 33, 48)] == [1, 2, 4, 8, 32, 48, 48]
    assert padded_batch_size(49, sizes) is None and padded_batch_size(0, sizes) is None


def test_padding_rows_are_one_token_requests_in_the_scratch_page():
    """The padded table is the one the batch builder makes when the padding rows are requests of
    their own: token 0 at position 0 of the scratch page."""
    page_size, scratch = 4, 9
    items = [BatchItem([11], 6, [0, 1]), BatchItem([12], 0, [2]), BatchItem([13], 4, [3, 4])]
    batch = build_forward_batch(items, page_size)
    padded = pad_decode_batch(batch.kv_page_indptr, batch.kv_page_indices, batch.kv_last_page_len,
                              batch.kv_slot_ids, 8, scratch, page_size)
    expected = build_forward_batch(items + [BatchItem([0], 0, [scratch])] * 5, page_size)
    assert padded.batch_size == 8 and padded.num_requests == 3
    for name in ("kv_page_indptr", "kv_page_indices", "kv_last_page_len", "kv_slot_ids"):
        assert torch.equal(getattr(padded, name), getattr(expected, name)), name
        assert getattr(padded, name).dtype == getattr(expected, name).dtype, name
    same = pad_decode_batch(batch.kv_page_indptr, batch.kv_page_indices, batch.kv_last_page_len,
                            batch.kv_slot_ids, 3, scratch, page_size)
    assert torch.equal(same.kv_page_indptr, batch.kv_page_indptr)
    with pytest.raises(ValueError, match="cannot pad a batch of 3 requests to 2"):
        pad_decode_batch(batch.kv_page_indptr, batch.kv_page_indices, batch.kv_last_page_len,
                         batch.kv_slot_ids, 2, scratch, page_size)


def test_only_a_device_counter_can_be_held_by_a_graph():
    memory = torch.zeros(2, dtype=torch.int64)
    assert is_capturable_counter(None)
    assert is_capturable_counter(DeviceLayerCounter(memory, memory).on_layer_done)
    assert not is_capturable_counter(LayerCounter().on_layer_done)  # Python a replay would skip
    assert not is_capturable_counter(lambda layer_id, output: None)
    with pytest.raises(ValueError, match="DeviceLayerCounter"):
        CudaGraphStep(None, None, 4, 0, LayerCounter().on_layer_done)  # type: ignore[arg-type]


def test_a_cpu_engine_captures_nothing_and_keeps_every_page():
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=16)) as engine:
        assert engine.runner.num_scratch_pages == 0 and not isinstance(engine.runner.step, CudaGraphStep)
        assert engine.kv.num_free_pages == engine.kv.num_pages == 16


# --- GPU ----------------------------------------------------------------------------------------------

PROMPTS = [[(5 * i + j) % 200 + 1 for j in range(n)] for i, n in enumerate((9, 3, 17, 6, 1))]
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


def cuda_config(compile: bool, **kwargs) -> EngineConfig:
    # bfloat16: FlashInfer's kernels (the only graph-capturable attention here) take 16-bit queries
    return EngineConfig(device="cuda", dtype="bfloat16", page_size=4, num_pages=128, max_num_seqs=8,
                        compile=compile, **kwargs)


@pytest.mark.gpu
@needs_gpu
def test_replayed_decode_logits_equal_the_eager_cuda_step():
    """One engine, one decode batch (3 requests: graph of 4, one padding row), run through the graph
    and eagerly: the same logits; the padding row wrote only the scratch page."""
    with LLMEngine(MODEL, cuda_config(compile=True)) as engine:
        runner = engine.runner
        graphs = runner.step
        assert isinstance(graphs, CudaGraphStep) and runner.num_scratch_pages == 1 and engine.kv.num_free_pages == 127
        prompts = PROMPTS[:3]
        pages = [[2 * i, 2 * i + 1, 2 * i + 20, 2 * i + 21, 2 * i + 40] for i in range(3)]
        prefill = [BatchItem(p, 0, pg) for p, pg in zip(prompts, pages)]
        runner.run(build_forward_batch(prefill, 4, "cuda"))
        decode = [BatchItem([7 + i], len(p), pg) for i, (p, pg) in enumerate(zip(prompts, pages))]
        batch = build_forward_batch(decode, 4, "cuda")
        assert graphs.can_run(batch)
        num_layers = engine.kv.cache.geometry.num_layers
        before = [torch.stack(engine.kv.cache.k_v_token_major(layer)).clone() for layer in range(num_layers)]
        hidden_graph, logits_graph = runner.run(batch)
        assert graphs.num_replays == 1
        changed = set()
        for layer in range(num_layers):
            diff = torch.stack(engine.kv.cache.k_v_token_major(layer)) != before[layer]  # [2, pages, ...]
            changed |= set(diff.flatten(2).any(-1).any(0).nonzero().flatten().tolist())
        scratch = engine.kv.cache.num_pages - 1
        assert engine.kv.num_pages == scratch  # requests never hold the scratch page: gauges count without it
        new_token_pages = {pg[len(p) // 4] for p, pg in zip(prompts, pages)}
        assert changed and changed <= new_token_pages | {scratch}  # the pages of the new tokens only
        runner.step = None  # the same step eagerly (it rewrites the same KV slots)
        try:
            hidden_eager, logits_eager = runner.run(batch)
        finally:
            runner.step = graphs
        torch.testing.assert_close(hidden_graph, hidden_eager, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(logits_graph, logits_eager, atol=2e-2, rtol=2e-2)
        assert torch.equal(logits_graph.argmax(-1), logits_eager.argmax(-1))


@pytest.mark.gpu
@needs_gpu
def test_graph_decode_gives_the_eager_cuda_engine_tokens_and_close_to_the_cpu_engine():
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=128)) as cpu:
        cpu_tokens = [o.output_ids for o in cpu.generate(PROMPTS, GREEDY)]
    with LLMEngine(MODEL, cuda_config(compile=False)) as eager:
        assert eager.runner.step is None
        eager_tokens = [o.output_ids for o in eager.generate(PROMPTS, GREEDY)]
    with LLMEngine(MODEL, cuda_config(compile=True)) as graphed:
        graphed_tokens = [o.output_ids for o in graphed.generate(PROMPTS, GREEDY)]
        assert isinstance(graphed.runner.step, CudaGraphStep) and graphed.runner.step.num_replays > 0
    # the first decode step (all five requests: the graph of 8) gives every request the eager token;
    # later steps may differ by a near tie (bfloat16 matmuls of 8 padded rows against 5)
    assert [t[1] for t in graphed_tokens] == [t[1] for t in eager_tokens]
    same = sum(a == b for g, e in zip(graphed_tokens, eager_tokens) for a, b in zip(g, e))
    assert same >= 0.9 * sum(len(t) for t in eager_tokens)
    # bfloat16 against the CPU's float32: the first token of each request, and most of the rest
    assert [t[0] for t in graphed_tokens] == [t[0] for t in cpu_tokens]
    agree = sum(a == b for g, c in zip(graphed_tokens, cpu_tokens) for a, b in zip(g, c))
    assert agree > 0.5 * sum(len(t) for t in cpu_tokens)


def stream_steps(engine: LLMEngine) -> list[list[tuple[int, int]]]:
    """Generate PROMPTS while a thread waits for each layer of each step, as the prefill messenger's
    streamer does; returns per step what ``read`` gave after each wait."""
    num_layers = engine.arch.num_layers
    steps: queue.Queue[int | None] = queue.Queue()
    seen: list[list[tuple[int, int]]] = []

    def on_step(chunks) -> None:
        steps.put(engine.layer_counter.read()[0] + 1)  # begin_step comes right after this hook

    def stream() -> None:
        while (step_id := steps.get()) is not None:
            reads = []
            for layer in range(num_layers):
                if not engine.layer_counter.wait(step_id, layer + 1, timeout_s=30):
                    break
                reads.append(engine.layer_counter.read())
            seen.append(reads)

    engine.on_step = on_step
    thread = threading.Thread(target=stream)
    thread.start()
    try:
        engine.generate(PROMPTS, GREEDY)
    finally:
        steps.put(None)
        thread.join(60)
    return seen


@pytest.mark.gpu
@needs_gpu
def test_layer_counter_under_graph_replay_streams_every_layer_as_the_cpu_twin_does():
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=128, count_layers=True)) as cpu:
        assert type(cpu.layer_counter) is LayerCounter
        cpu_seen = stream_steps(cpu)
    with LLMEngine(MODEL, cuda_config(compile=True, count_layers=True)) as gpu:
        assert type(gpu.layer_counter) is DeviceLayerCounter
        gpu_seen = stream_steps(gpu)
        assert isinstance(gpu.runner.step, CudaGraphStep) and gpu.runner.step.num_replays > 0
        final = gpu.layer_counter.read()
    num_layers = gpu.arch.num_layers
    assert len(gpu_seen) == len(cpu_seen) > 0
    for step, (gpu_reads, cpu_reads) in enumerate(zip(gpu_seen, cpu_seen), start=1):
        assert len(gpu_reads) == len(cpu_reads) == num_layers  # every layer's wait returned
        assert [s for s, _ in gpu_reads] == [s for s, _ in cpu_reads] == [step] * num_layers
        assert all(n >= layer + 1 for layer, (_, n) in enumerate(gpu_reads))
    assert final == (len(gpu_seen), num_layers)
