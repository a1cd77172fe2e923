"""Kernel times from aiconfigurator-core's measured tables: which table each kernel shape reads, at which coordinates."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import attrs

from disaggsdk.sim.grid_interp import Cell, GridFit, Lookup, MonotoneGrid, Point, SlicedTable
from disaggsdk.sim.kernel_db import KernelDb, TableFile
from disaggsdk.sim.kernels import AllReduce, Attention, Collective, Elementwise, ExpertExchange, Gemm, KernelTime, MoeExperts
from disaggsdk.sim.roofline_kernels import RooflineKernels

MS = 1e-3
US = 1e-6
GPUS_PER_NODE = 8  # every DeepEP measurement used whole 8-GPU nodes
DEEPEP_NORMAL_SMS = 20  # DeepEP's default Buffer.num_sms, which SGLang and vLLM keep
# DeepSeek-V3/R1's MLA widths, the only ones the MLA tables measured
MLA_WIDTHS = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "head_dim": 128 + 64, "v_head_dim": 128}
_FIT_ORDER: dict[GridFit, int] = {"exact": 0, "interpolated": 1, "extrapolated": 2}


@attrs.frozen
class TableSpec:
    """How one measured table reads: its file, which columns are categorical and which are work axes,
    and the columns that sum to a time (in ``unit_s`` seconds)."""

    family: str
    table: str
    categorical: tuple[str, ...]
    work: tuple[str, ...]
    time_columns: tuple[str, ...] = ("latency",)
    unit_s: float = MS
    framework: str | None = None  # None: the profile's framework; "nccl": NCCL's own tables


GEMM = TableSpec("gemm", "gemm_perf", ("gemm_dtype",), ("m", "n", "k"))
MLA_BMM = TableSpec("mla_bmm", "mla_bmm_perf", ("op_name", "bmm_dtype"), ("num_tokens", "num_heads"))
_ATTENTION_KEY = ("attn_dtype", "kv_cache_dtype", "head_dim", "num_heads", "num_key_value_heads", "window_size")
CONTEXT_ATTENTION = TableSpec("attention", "context_attention_perf", _ATTENTION_KEY, ("batch_size", "isl"))
GENERATION_ATTENTION = TableSpec("attention", "generation_attention_perf", _ATTENTION_KEY, ("batch_size", "step"))
# heads on the device, not tp: the tables label rows with a tp_size of their own (heads x tp_size = 64, 128 at 1),
# and aiconfigurator keys its queries by 128 // tp heads alone
_MLA_KEY = ("mla_dtype", "kv_cache_dtype", "num_heads")
CONTEXT_MLA = TableSpec("mla", "context_mla_perf", _MLA_KEY, ("batch_size", "isl"))
GENERATION_MLA = TableSpec("mla", "generation_mla_perf", _MLA_KEY, ("batch_size", "step"))
_MOE_KEY = ("moe_dtype", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size", "distribution")
MOE = TableSpec("moe", "moe_perf", _MOE_KEY, ("num_tokens",))
WIDEEP_MOE = {phase: TableSpec("moe", f"wideep_{phase}_moe_perf", _MOE_KEY, ("num_tokens",))
              for phase in ("context", "generation")}
CUSTOM_ALLREDUCE = TableSpec("comm", "custom_allreduce_perf", ("allreduce_dtype", "num_gpus", "backend"), ("message_size",))
NCCL_COLLECTIVES = TableSpec("comm", "nccl_perf", ("op_name", "nccl_dtype", "num_gpus"), ("message_size",), framework="nccl")
DEEPEP_NORMAL = {phase: TableSpec("comm", "wideep_deepep_normal_perf", ("hidden_size", "num_topk", "num_experts", "dispatch_sms"),
                                  ("node_num", "num_token"), (f"{phase}_transmit_us", f"{phase}_notify_us"), US)
                 for phase in ("dispatch", "combine")}
DEEPEP_LOW_LATENCY = {phase: TableSpec("comm", "wideep_deepep_ll_perf", ("hidden_size", "num_topk", "num_experts"),
                                       ("node_num", "num_token"), (f"{phase}_avg_t_us",), US)
                      for phase in ("dispatch", "combine")}
MOE_A2A = TableSpec("comm", "moe_a2a_perf", ("comm_backend", "phase", "ep_size", "hidden_size", "topk", "num_experts"),
                    ("node_num", "num_tokens"), ("latency",), US)


@attrs.frozen
class _Answer:
    lookup: Lookup
    file: TableFile
    grid: MonotoneGrid
    key: tuple[tuple[str, Cell], ...]


def _seconds(cells: tuple[Cell | None, ...], unit_s: float) -> float | None:
    # one row's time: its time columns summed (None if one is missing)
    if any(c is None for c in cells):
        return None
    return math.fsum(float(c) for c in cells if c is not None) * unit_s


def _worse(a: GridFit, b: GridFit) -> GridFit:
    return a if _FIT_ORDER[a] >= _FIT_ORDER[b] else b


class TableKernels:
    """`kernels.KernelCosts` from a `KernelDb`'s tables (module doc); None where no table covers a shape.
    ``roofline`` extrapolates past the tables' grids; it never answers for them."""

    def __init__(self, db: KernelDb, roofline: RooflineKernels) -> None:
        self.db = db
        self.roofline = roofline
        self._tables: dict[tuple[TableSpec, TableFile], SlicedTable | None] = {}
        self._sources: dict[tuple[TableFile, tuple[tuple[str, Cell], ...]], str] = {}

    # reading tables

    def _sliced(self, spec: TableSpec, file: TableFile) -> SlicedTable | None:
        if (spec, file) not in self._tables:
            rows = self.db.read(file, (*spec.categorical, *spec.work, *spec.time_columns))
            table = None
            if rows is not None:
                times = [_seconds(cells, spec.unit_s) for cells in zip(*(rows[c] for c in spec.time_columns))]
                table = SlicedTable(rows, spec.categorical, spec.work, times)
            self._tables[(spec, file)] = table
        return self._tables[(spec, file)]

    def _answer(self, spec: TableSpec, key: Mapping[str, Cell], query: Point,
                roofline: Callable[[Point], float]) -> _Answer | None:
        # the first version directory answering from inside its grid; else the mildest extrapolation
        best: _Answer | None = None
        for file in self.db.versions(spec.family, spec.table, spec.framework):
            table = self._sliced(spec, file)
            grid = table.grid(key) if table is not None else None
            found = grid.at(query, roofline) if grid is not None else None
            if grid is None or found is None:
                continue
            answer = _Answer(found, file, grid, tuple((c, key[c]) for c in spec.categorical))
            if found.fit != "extrapolated":
                return answer
            if best is None or abs(math.log(found.ratio)) < abs(math.log(best.lookup.ratio)):
                best = answer
        return best

    def _source(self, answer: _Answer) -> str:
        source = self._sources.get((answer.file, answer.key))
        if source is None:
            key = " ".join(f"{c}={v}" for c, v in answer.key)
            grid = answer.grid
            source = (f"{self.db.describe(answer.file)} [{key}] (cleaning moved {grid.cleaned_points} of "
                      f"{grid.measured_points} points by > 1 %, at most {grid.largest_move:.0%})")
            self._sources[(answer.file, answer.key)] = source
        return source

    def _time(self, answer: _Answer | None) -> KernelTime | None:
        if answer is None:
            return None
        return KernelTime(answer.lookup.value, self._source(answer), answer.lookup.fit)

    # kernels

    def gemm(self, shape: Gemm) -> KernelTime | None:
        """A linear layer from ``gemm_perf``; MLA's absorbed batched products from ``mla_bmm_perf``."""
        if shape.batch == 1:
            return self._time(self._answer(
                GEMM, {"gemm_dtype": shape.dtype}, (shape.m, shape.n, shape.k),
                lambda p: self.roofline.gemm(attrs.evolve(shape, m=round(p[0]), n=round(p[1]), k=round(p[2]))).seconds))
        widths = (shape.k, shape.n)
        op = {(128, 512): "mla_gen_pre", (512, 128): "mla_gen_post"}.get(widths)
        if op is None:
            return None
        return self._time(self._answer(
            MLA_BMM, {"op_name": op, "bmm_dtype": "bfloat16" if shape.dtype == "bfloat16" else "fp8"}, (shape.m, shape.batch),
            lambda p: self.roofline.gemm(attrs.evolve(shape, m=round(p[0]), batch=round(p[1]))).seconds))

    def attention(self, shape: Attention) -> KernelTime | None:
        """GQA from the attention tables, MLA from SGLang's MLA kernel tables (module doc)."""
        if shape.attention == "mla":
            if any(getattr(shape, field) != width for field, width in MLA_WIDTHS.items()):
                return None
            key: dict[str, Cell] = {"mla_dtype": "bfloat16", "kv_cache_dtype": shape.kv_dtype, "num_heads": shape.num_heads}
            return self._phase(shape, CONTEXT_MLA if shape.phase == "context" else GENERATION_MLA, key)
        spec = CONTEXT_ATTENTION if shape.phase == "context" else GENERATION_ATTENTION
        if shape.head_dim != shape.v_head_dim:
            return None
        for attn_dtype in dict.fromkeys((shape.kv_dtype, "bfloat16")):  # FP8 attention with an FP8 cache where measured
            key = {"attn_dtype": attn_dtype, "kv_cache_dtype": shape.kv_dtype, "head_dim": shape.head_dim,
                   "num_heads": shape.num_heads, "num_key_value_heads": shape.num_kv_heads, "window_size": shape.window}
            found = self._phase(shape, spec, key)
            if found is not None:
                return found
        return None

    def _phase(self, shape: Attention, spec: TableSpec, key: Mapping[str, Cell]) -> KernelTime | None:
        if shape.phase == "generation":
            return self._time(self._answer(
                spec, key, (shape.batch * shape.new_tokens, shape.cached_tokens),
                lambda p: self.roofline.attention(attrs.evolve(shape, batch=round(p[0]), new_tokens=1,
                                                               cached_tokens=round(p[1]))).seconds))

        def prompt(tokens: int) -> _Answer | None:  # a whole causal prompt of ``tokens`` per sequence
            return self._answer(spec, key, (shape.batch, tokens), lambda p: self.roofline.attention(
                attrs.evolve(shape, batch=round(p[0]), new_tokens=round(p[1]), cached_tokens=0)).seconds)

        whole = prompt(shape.cached_tokens + shape.new_tokens)
        if whole is None or shape.cached_tokens == 0:
            return self._time(whole)
        prefix, alone = prompt(shape.cached_tokens), prompt(shape.new_tokens)
        if prefix is None or alone is None:
            return None
        seconds = max(whole.lookup.value - prefix.lookup.value, alone.lookup.value)
        fit = _worse(whole.lookup.fit, _worse(prefix.lookup.fit, alone.lookup.fit))
        return KernelTime(seconds, self._source(whole), fit)

    def moe_experts(self, shape: MoeExperts) -> KernelTime | None:
        """The fused MoE kernel's table, or with ``deepep`` SGLang's wide-EP tables first (module doc)."""
        key: dict[str, Cell] = {"moe_dtype": shape.dtype, "hidden_size": shape.hidden_size, "inter_size": shape.inter_size,
                                "topk": shape.topk, "num_experts": shape.num_experts, "moe_tp_size": shape.moe_tp,
                                "moe_ep_size": shape.moe_ep}

        def roofline(p: Point) -> float:
            return self.roofline.moe_experts(attrs.evolve(shape, num_tokens=round(p[0]))).seconds

        found = None
        if shape.deepep:
            found = self._answer(WIDEEP_MOE[shape.phase], {**key, "distribution": "uniform"}, (shape.num_tokens,), roofline)
        if found is None:
            found = self._answer(MOE, {**key, "distribution": "balanced"}, (shape.num_tokens,), roofline)
        if found is None and shape.moe_ep > 1 and shape.moe_ep & (shape.moe_ep - 1):
            # the tables measure expert-parallel groups of powers of two: a group of another size (LMSYS's 72)
            # is timed as the largest measured one below it with the same tokens a device (each of its devices
            # then holds a few more experts than ours: an upper bound), or not at all
            measured_ep = 1 << (shape.moe_ep.bit_length() - 1)
            return self.moe_experts(attrs.evolve(shape, moe_ep=measured_ep,
                                                 num_tokens=max(1, shape.num_tokens * measured_ep // shape.moe_ep)))
        return self._time(found)

    def collective(self, shape: Collective) -> KernelTime | None:
        """A one-node all-reduce (custom, else NCCL's table) or a DeepEP dispatch / combine (module doc)."""
        if isinstance(shape, AllReduce):
            return self._all_reduce(shape)
        return self._exchange(shape)

    def _all_reduce(self, shape: AllReduce) -> KernelTime | None:
        if shape.nodes != 1:
            return None

        def roofline(p: Point) -> float:
            return self.roofline.collective(attrs.evolve(shape, elements=round(p[0]))).seconds

        found = None
        if shape.backend == "custom" and shape.dtype == "bfloat16":
            key: dict[str, Cell] = {"allreduce_dtype": "bfloat16", "num_gpus": shape.ranks,
                                    "backend": f"{self.db.ref.framework}_graph"}
            found = self._answer(CUSTOM_ALLREDUCE, key, (shape.elements,), roofline)
        if found is None:
            key = {"op_name": "all_reduce", "nccl_dtype": "half" if shape.dtype == "bfloat16" else "int8",
                   "num_gpus": shape.ranks}
            found = self._answer(NCCL_COLLECTIVES, key, (shape.elements,), roofline)
        return self._time(found)

    def _exchange(self, shape: ExpertExchange) -> KernelTime | None:
        if shape.ranks != GPUS_PER_NODE * shape.nodes:
            return None

        def roofline(p: Point) -> float:
            nodes = round(p[0])
            return self.roofline.collective(attrs.evolve(shape, nodes=nodes, ranks=GPUS_PER_NODE * nodes,
                                                         tokens=round(p[1]))).seconds

        query = (shape.nodes, shape.tokens)
        shape_key: dict[str, Cell] = {"hidden_size": shape.hidden_size, "num_topk": shape.topk,
                                      "num_experts": shape.num_experts}
        if shape.mode == "normal":
            found = self._answer(DEEPEP_NORMAL[shape.phase], {**shape_key, "dispatch_sms": DEEPEP_NORMAL_SMS}, query, roofline)
        else:
            found = self._answer(DEEPEP_LOW_LATENCY[shape.phase], shape_key, query, roofline)
        if found is None:  # vLLM's one table of both modes
            key: dict[str, Cell] = {"comm_backend": "deepep_ht" if shape.mode == "normal" else "deepep_ll",
                                    "phase": shape.phase, "ep_size": shape.ranks, "hidden_size": shape.hidden_size,
                                    "topk": shape.topk, "num_experts": shape.num_experts}
            found = self._answer(MOE_A2A, key, query, roofline)
        return self._time(found)

    def elementwise(self, shape: Elementwise) -> KernelTime | None:
        """None: no table measures embeddings, norms or activations (aiconfigurator estimates them too)."""
        return None
