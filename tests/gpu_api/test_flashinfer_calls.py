"""Every call the FlashInfer backend makes binds to the installed FlashInfer (CPU, no GPU needed).

The project's own code runs: a tiny model's prefill and decode steps through `FlashInferBackend`
(GQA in both layouts, MLA, bfloat16 and fp8 caches), and `CudaGraphStep`'s capture and replay. Only
the device work is intercepted: FlashInfer's wrapper classes are stand-ins (tests/gpu_api/
installed_signatures.py) that bind each constructor and method call to the installed FlashInfer's
signature, check every value against its annotation and refuse the forms FlashInfer deprecates,
then answer with zeros of the output's shape; the backend's CUDA device check is lifted, so its
tensors stay on the CPU; `CudaGraphStep`'s ``torch.cuda`` calls are stand-ins checked against
torch's own signatures.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # FlashInfer's own imports of names CUTLASS renamed
    import flashinfer
    from flashinfer.mla import BatchMLAPagedAttentionWrapper, MLAPlanMetadata

from disaggsdk.engine.attention import create_backend, flashinfer_backend
from disaggsdk.engine.attention.flashinfer_backend import FlashInferBackend
from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch
from disaggsdk.engine.compiled_step.cuda_graphs import CudaGraphStep
from disaggsdk.engine.kv_cache import KVCache
from disaggsdk.engine.kv_scales import KVScales
from disaggsdk.engine.modeling import build_model, kv_geometry
from disaggsdk.engine.parallel import TensorParallel
from tests.gpu_api.installed_signatures import (
    ApiCall,
    CallMismatch,
    CallRecorder,
    Deprecated,
    InstanceStandIn,
    ModuleStandIn,
    Rules,
    stand_in,
)

Prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper
Decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper
INTERCEPTED = frozenset({Prefill, Decode, BatchMLAPagedAttentionWrapper})
# what the installed FlashInfer (0.7) says of its own signatures: the decode wrapper's plan takes
# its options as **kwargs and hands them to _plan_impl; the MLA wrapper deprecates positional
# arguments, flat page-table tensors in plan and separate q_nope/q_pe/ckv/kpe tensors in run
RULES = Rules(
    forwards={Decode.plan: Decode._plan_impl},
    deprecated={
        BatchMLAPagedAttentionWrapper.plan: Deprecated(
            positional=True, names=frozenset({"qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr"})),
        BatchMLAPagedAttentionWrapper.run: Deprecated(
            positional=True, names=frozenset({"q_nope", "q_pe", "ckv_cache", "kpe_cache"})),
    },
)
CUDA_GRAPH_STEP = Path(inspect.getsourcefile(CudaGraphStep) or "")
PAGE_SIZE, NUM_PAGES = 4, 32
# (tokens already cached, new tokens) per request: a fresh prefill and a chunk over cached pages
CHUNKS = [(0, 6), (5, 3)]


def _zeros_like_query(call: ApiCall, instance: InstanceStandIn | None) -> torch.Tensor:
    return torch.zeros_like(call.arguments["q"])  # type: ignore[arg-type]


def _mla_output(call: ApiCall, instance: InstanceStandIn | None) -> torch.Tensor:
    assert instance is not None
    plan = [c for c in instance.calls if c.name.endswith(".plan")][-1]  # the plan this run uses
    query = call.arguments["query"]
    q_latent = query[0] if isinstance(query, tuple) else query
    head_dim_ckv = int(plan.arguments["head_dim_ckv"])  # type: ignore[call-overload]
    return q_latent.new_zeros(*q_latent.shape[:-1], head_dim_ckv)  # type: ignore[union-attr]


ANSWERS = {"BatchPrefillWithPagedKVCacheWrapper.run": _zeros_like_query,
           "BatchDecodeWithPagedKVCacheWrapper.run": _zeros_like_query,
           "BatchMLAPagedAttentionWrapper.run": _mla_output}


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> CallRecorder:
    """FlashInfer's modules as the backend imports them: stand-ins over the installed ones."""
    recorder = CallRecorder(RULES, ANSWERS)
    for name, module in list(sys.modules.items()):
        if name == "flashinfer" or name.startswith("flashinfer."):
            monkeypatch.setitem(sys.modules, name, ModuleStandIn(module, INTERCEPTED, recorder))
    monkeypatch.setattr(flashinfer_backend, "_require_cuda", lambda device: None)  # the tensors stay on the CPU
    return recorder


def _cache(model: torch.nn.Module, layout: str, kv_dtype: str) -> KVCache:
    geometry = kv_geometry(model.arch, TensorParallel(0, 1))  # type: ignore[arg-type]
    scales = KVScales((0.5,) * geometry.num_layers, (0.25,) * geometry.num_layers) if kv_dtype == "fp8" else None
    return KVCache(geometry, NUM_PAGES, PAGE_SIZE, layout, kv_dtype, "cpu", scales=scales)


def _steps(model: torch.nn.Module, backend: FlashInferBackend) -> None:
    """A prefill step (a fresh request and a chunk over cached pages), then a decode step, as
    `ModelRunner` runs them: plan once, the model's forward runs every layer."""
    pages = [[0, 1, 2], [3, 4, 5]]
    prefill = [BatchItem([7] * new, cached, pages[i]) for i, (cached, new) in enumerate(CHUNKS)]
    decode = [BatchItem([9], cached + new, pages[i]) for i, (cached, new) in enumerate(CHUNKS)]
    for items in (prefill, decode):
        batch = build_forward_batch(items, PAGE_SIZE)
        backend.plan(batch)
        hidden = model(batch, backend)
        assert hidden.shape[0] == batch.num_tokens


def _index_tensors(call: ApiCall) -> dict[str, torch.Tensor]:
    """The page-table tensors of a call (FlashInfer documents them int32), the MLA metadata's included."""
    found = {}
    for name, value in call.arguments.items():
        if isinstance(value, MLAPlanMetadata):
            found.update({f"metadata.{k}": v for k, v in vars(value).items() if isinstance(v, torch.Tensor)})
        elif isinstance(value, torch.Tensor) and any(key in name for key in ("indptr", "indices", "last_page_len")):
            found[name] = value
    return found


def _assert_page_tables_are_int32(recorder: CallRecorder) -> None:
    for call in recorder.calls:
        for name, tensor in _index_tensors(call).items():
            assert tensor.dtype == torch.int32, f"{call.name}: {name} is {tensor.dtype}; FlashInfer takes int32"


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "fp8"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_gqa_steps_call_the_installed_wrappers(recorder, layout, kv_dtype):
    model = build_model("qwen3-tiny", TensorParallel(0, 1), dtype="bfloat16", load_format="dummy")
    backend = create_backend("flashinfer", _cache(model, layout, kv_dtype))
    _steps(model, backend)
    num_layers = model.arch.num_layers
    assert [c.name for c in recorder.calls[:2]] == ["BatchPrefillWithPagedKVCacheWrapper.__init__",
                                                    "BatchDecodeWithPagedKVCacheWrapper.__init__"]
    assert recorder.calls[0].arguments["kv_layout"] == layout
    # plan once per step, run once per layer
    assert len(recorder.named("BatchPrefillWithPagedKVCacheWrapper.plan")) == 1
    assert len(recorder.named("BatchDecodeWithPagedKVCacheWrapper.plan")) == 1
    runs = recorder.named("BatchPrefillWithPagedKVCacheWrapper.run") + recorder.named("BatchDecodeWithPagedKVCacheWrapper.run")
    assert len(runs) == 2 * num_layers
    fp8 = kv_dtype == "fp8"
    for call in runs:
        assert ("k_scale" in call.arguments and "v_scale" in call.arguments) == fp8, call.arguments.keys()
    plan = recorder.named("BatchDecodeWithPagedKVCacheWrapper.plan")[0]
    assert plan.arguments["kv_data_type"] == (torch.float8_e4m3fn if fp8 else torch.bfloat16)
    assert plan.arguments["q_data_type"] == torch.bfloat16
    _assert_page_tables_are_int32(recorder)


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "fp8"])
def test_mla_steps_call_the_installed_wrapper(recorder, kv_dtype):
    model = build_model("deepseek-r1-tiny", TensorParallel(0, 1), dtype="bfloat16", load_format="dummy")
    backend = create_backend("flashinfer", _cache(model, "HND", kv_dtype))
    _steps(model, backend)
    assert [c.name for c in recorder.calls[:1]] == ["BatchMLAPagedAttentionWrapper.__init__"]
    plans = recorder.named("BatchMLAPagedAttentionWrapper.plan")
    runs = recorder.named("BatchMLAPagedAttentionWrapper.run")
    assert len(plans) == 2 and len(runs) == 2 * model.arch.num_layers
    assert {(p.arguments["query_layout"], p.arguments["kv_cache_layout"]) for p in plans} == {("split", "split")}
    for call in runs:
        assert ("ckv_scale" in call.arguments) == (kv_dtype == "fp8")
    _assert_page_tables_are_int32(recorder)


def _torch_cuda_names(path: Path) -> set[str]:
    """The ``torch.cuda.X`` names a module's source uses."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "torch.cuda":
            names.add(node.attr)
    return names


def _current_stream_answer(recorder: CallRecorder, stream_cls: type) -> object:
    return lambda call, instance: InstanceStandIn(stream_cls, None, recorder)


def test_cuda_graph_decode_plans_and_runs_the_installed_graph_wrappers(recorder, monkeypatch):
    """`CudaGraphStep` as the model runner drives it: capture every size, then replay a decode step;
    its ``torch.cuda`` calls (streams, the graph) are stand-ins checked against torch's signatures."""
    names = _torch_cuda_names(CUDA_GRAPH_STEP)
    assert {"CUDAGraph", "graph", "Stream", "stream", "current_stream", "synchronize"} <= names
    recorder.answers = {**ANSWERS, "current_stream": _current_stream_answer(recorder, torch.cuda.Stream),
                        "stream": lambda call, instance: _NoStream(), "CUDAGraph.pool": lambda call, instance: (0, 1)}
    stand_ins = {name: stand_in(getattr(torch.cuda, name), recorder) for name in names}  # all made, then patched
    for name, replacement in stand_ins.items():
        monkeypatch.setattr(torch.cuda, name, replacement)
    model = build_model("qwen3-tiny", TensorParallel(0, 1), dtype="bfloat16", load_format="dummy")
    backend = create_backend("flashinfer", _cache(model, "HND", "bfloat16"))
    assert isinstance(backend, FlashInferBackend)
    graphs = CudaGraphStep(model, backend, max_batch_size=4, scratch_page_id=NUM_PAGES - 1, on_layer_done=None)
    graphs.capture()
    wrappers = [i for i in recorder.instances if i.stands_in_for is Decode and i.calls[0].arguments.get("use_cuda_graph")]
    assert len(wrappers) == len(graphs.batch_sizes) == 3  # sizes 1, 2, 4
    for wrapper, size in zip(wrappers, graphs.batch_sizes):
        made = wrapper.calls[0].arguments
        assert made["paged_kv_indptr_buffer"].shape == (size + 1,)  # type: ignore[attr-defined]
        assert made["paged_kv_last_page_len_buffer"].shape == (size,)  # type: ignore[attr-defined]
    batch = build_forward_batch([BatchItem([3], 5, [0, 1]), BatchItem([4], 2, [2]), BatchItem([5], 0, [3])], PAGE_SIZE)
    assert graphs.can_run(batch)
    hidden = graphs(batch)  # outside inference mode: the step enters it itself
    assert hidden.shape == (3, model.arch.hidden_size) and graphs.num_replays == 1
    replayed = [c for c in wrappers[2].calls if c.name.endswith(".plan")][-1]  # 3 requests replay the graph of 4
    assert replayed.arguments["indptr"].shape == (5,)  # type: ignore[attr-defined]
    assert recorder.named("CUDAGraph.replay")
    _assert_page_tables_are_int32(recorder)


class _NoStream:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# the checks themselves: a wrong call fails them

def test_a_call_the_installed_flashinfer_rejects_is_a_mismatch():
    recorder = CallRecorder(RULES, ANSWERS)
    wrappers = ModuleStandIn(flashinfer, INTERCEPTED, recorder)
    workspace = torch.zeros(8, dtype=torch.uint8)
    with pytest.raises(CallMismatch, match="rejects this call"):
        wrappers.BatchDecodeWithPagedKVCacheWrapper(workspace, "HND", paged_kv_indptr_buf=workspace)
    decode = wrappers.BatchDecodeWithPagedKVCacheWrapper(workspace, "HND")
    index = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(CallMismatch, match="rejects this call"):  # through **kwargs to _plan_impl, which lacks it
        decode.plan(index, index, index, 8, 2, 64, 4, causal=True)
    with pytest.raises(CallMismatch, match="too many positional"):  # FlashInfer's deprecated positional options
        decode.plan(index, index, index, 8, 2, 64, 4, "NONE")
    with pytest.raises(CallMismatch, match=r"catch-all \*args"):  # run's *args take anything: binding there proves nothing
        decode.run(workspace, (workspace, workspace), workspace)
    with pytest.raises(CallMismatch, match="sm_scale="):
        decode.plan(index, index, index, 8, 2, 64, 4, sm_scale=torch.tensor(0.1))
    with pytest.raises(CallMismatch, match="k_scale="):
        decode.run(workspace, (workspace, workspace), k_scale=torch.tensor(1.0))
    mla = wrappers.mla.BatchMLAPagedAttentionWrapper(workspace)
    with pytest.raises(CallMismatch, match="positional arguments are deprecated"):
        mla.run(workspace, workspace, workspace, workspace)
    with pytest.raises(CallMismatch, match=r"\['ckv_cache', 'kpe_cache'\] are deprecated"):
        mla.run(query=(workspace, workspace), ckv_cache=workspace, kpe_cache=workspace)
    with pytest.raises(CallMismatch, match="query_layout="):
        mla.plan(metadata=None, query_layout="interleaved")


def test_the_rules_match_what_the_installed_flashinfer_says():
    """The forwarding and the deprecations the checks apply are FlashInfer's own: if a release
    changes them, this fails and the rules (and the backend) get revisited."""
    assert "self._plan_impl(" in inspect.getsource(inspect.unwrap(Decode.plan))
    for function, deprecated in RULES.deprecated.items():
        parameters = inspect.signature(function).parameters
        assert deprecated.names <= set(parameters), function
    source = inspect.getsource(sys.modules[BatchMLAPagedAttentionWrapper.__module__])
    source = re.sub(r'"\s*\n\s*"', "", source)  # its messages as one string each, not split over lines
    assert "Positional MLA arguments are deprecated" in source
    assert "Passing flat BatchMLAPagedAttentionWrapper.plan metadata tensors is deprecated" in source
    assert "Legacy MLA tensor arguments q_nope/q_pe and ckv_cache/kpe_cache" in source
