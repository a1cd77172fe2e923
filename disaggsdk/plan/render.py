"""Showing a plan: rich tables in a terminal, the same tables as plain text for ``print``, an HTML
table in Jupyter.

Every face renders the same rows, built once by `plan_tables`; nothing here computes the plan.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from disaggsdk.plan.writes import expected_writes

if TYPE_CHECKING:
    from rich.console import Group

    from disaggsdk.plan.memory import RankMemory
    from disaggsdk.plan.plan import Plan
    from disaggsdk.plan.routes import Route, Transfer

class TextPrinter(Protocol):
    """The part of IPython's pretty printer that a ``_repr_pretty_`` uses."""

    def text(self, obj: str) -> None: ...


# (title, column headers, rows of cells)
TableData = tuple[str, tuple[str, ...], Sequence[tuple[str, ...]]]


def plan_tables(plan: Plan, num_tokens: int = 1024) -> list[TableData]:
    """The plan as plain tables of strings: ranks, routes, and the transfers of each route shape.

    Args:
        plan: the plan to show.
        num_tokens: prompt length for the expected-writes column.

    Returns:
        Tables in display order.
    """
    from disaggsdk.plan.kv_staging import kv_staging_summary
    from disaggsdk.plan.plan import instance_page_shape

    arch = plan.arch
    ranks: list[tuple[str, ...]] = []
    for inst in plan.instances:
        for r in inst.ranks:
            heads = r.kv_heads if isinstance(r.kv_heads, str) else f"[{r.kv_heads[0]}, {r.kv_heads[1]})"
            ranks.append(
                (
                    inst.name if r.rank == 0 else "",
                    str(r.index),
                    str(r.dp_rank),
                    str(r.tp_rank),
                    str(r.node),
                    str(r.gpu),
                    str(r.nic),
                    heads,
                    "" if r.replica_set is None else str(r.replica_set),
                )
            )
    bytes_per_token = {
        inst.name: instance_page_shape(plan, inst).page_bytes
        * plan.kv_layers
        // plan.spec.kv.page_size
        for inst in plan.instances
    }
    layout = plan.spec.kv.layout
    routes = []
    for route in plan.routes:
        writes = expected_writes(route, num_tokens, layout)
        routes.append(
            (
                f"{route.prefill} → {route.decode}",
                route.kind + (" (source per request)" if route.source_per_request else ""),
                str(len(route.transfers)),
                str(_per_page_layer(route, "HND")),
                str(_per_page_layer(route, "NHD")),
                f"{bytes_per_token[route.prefill]:,} → {bytes_per_token[route.decode]:,}",
                f"{writes.total:,}",
            )
        )
    if arch.attention == "mla":
        kv_desc = f"latent {arch.kv_lora_rank + arch.qk_rope_head_dim} per token"
    else:
        kv_desc = f"{arch.num_kv_heads} KV heads x {arch.head_dim}"
    tables: list[TableData] = [
        (
            f"{plan.spec.label}: {plan.spec.model} ({arch.attention.upper()}, {arch.num_layers} "
            f"layers, {kv_desc}) on {plan.num_nodes} node(s)",
            ("instance", "rank", "dp", "tp", "node", "gpu", "nic", "kv heads", "replica set"),
            ranks,
        ),
        (
            f"routes: writes per page per layer (whole dp group), KV bytes per token per rank, "
            f"expected writes for {num_tokens} tokens "
            f"({layout}, page_size {plan.spec.kv.page_size}); {kv_staging_summary(plan.spec)}",
            ("route", "kind", "transfers", "HND", "NHD", "KV B/token/rank", "expected"),
            routes,
        ),
    ]
    tables += memory_tables(plan)
    seen = set()
    for route in plan.routes:  # routes of equal shape differ only in replica choice: show one
        key = (route.src.tp, route.dst.tp, route.replica_assignment)
        if key in seen:
            continue
        seen.add(key)
        tables.append(_transfers_table(route))
    return tables


def memory_tables(plan: Plan) -> list[TableData]:
    """Each instance's memory per rank (GB), the weights by part of each role, and what does not fit.

    Ranks of an instance with equal figures share one row (under ``ep`` they differ only in which experts).
    """
    from disaggsdk.plan.kv_tiers import unit_tiers
    from disaggsdk.plan.memory import CONTEXT_LENGTHS, GB, device_memory_bytes, gb

    spec = plan.spec
    rows: list[tuple[str, ...]] = []
    for mem in plan.memory:
        groups: list[list[RankMemory]] = []
        for r in mem.ranks:
            if groups and _same_figures(groups[-1][0], r):
                groups[-1].append(r)
            else:
                groups.append([r])
        for group in groups:
            r = group[0]
            ranks = str(r.rank) if len(group) == 1 else f"{group[0].rank}-{group[-1].rank}"
            experts = "" if r.experts is None else (
                f"[{r.experts[0]}, {r.experts[1]})" if len(group) == 1 else _expert_runs(group))
            rows.append((
                mem.name if r is mem.ranks[0] else "", ranks, gb(r.weights.total), gb(r.workspace_bytes),
                gb(r.kv_pool_bytes) if r.free_bytes > 0 else f"{gb(r.free_bytes)} (does not fit)",
                f"{r.kv_tokens:,}" + (" (set)" if r.num_pages_explicit else ""),
                *(f"{mem.requests_at(n):,}" for n in CONTEXT_LENGTHS), experts))
    device = device_memory_bytes(spec)
    kind = "hardware.cpu_memory_gb" if spec.device == "cpu" else spec.hardware.gpu
    tables: list[TableData] = [(
        f"memory per rank in GB: {spec.engine.memory_utilization:g} x {gb(device)} GB ({kind}) = weights + "
        f"workspace + KV; KV tokens per rank, requests (prompt + output) per instance (docs/memory.md)",
        ("instance", "ranks", "weights", "work", "KV", "KV tokens", "req 2k", "req 8k", "experts"),
        rows)]
    parts: list[tuple[str, ...]] = []
    for role in plan.spec.roles:
        first = next((m for m in plan.memory if m.role == role), None)
        if first is None:
            continue
        w = first.ranks[0].weights
        shape = f"{role} tp{first.tp}" + (f" dp{first.dp}" if first.dp > 1 else "") + (
            f" ep{first.ep}" if first.ep > 1 else "")
        parts.append((shape, *(f"{n / GB:.2f}" for n in (w.attention, w.dense_mlp, w.moe_router, w.routed_experts,
                                                           w.shared_experts, w.embeddings, w.mtp, w.fp8_scales,
                                                           w.total))))
    tables.append((
        f"weights of rank 0 by part in GB: 16/32-bit tensors in {spec.weight_dtype}"
        + (", FP8 ones as stored" if spec.device == "cuda" else ", FP8 ones dequantized"),
        ("role", "attn", "dense", "router", "experts", "shared", "embed", "MTP", "scales", "total"),
        parts))
    tiers = unit_tiers(plan)
    if tiers:
        kv_tiers = plan.spec.kv.tiers
        tables.append((
            f"KV tiers per unit in GB (pages): a node's {kv_tiers.host_gb:g} GB host tier split among its units, "
            f"{kv_tiers.write_policy.replace('_', '-')}; the store is the deployment's, shared (docs/kv_tiers.md)",
            ("role", "units/node", "host", "disk", "store"),
            [(t.role, str(t.units_on_node),
              *(f"{gb(n)} ({t.pages(n):,})" if n else "-" for n in (t.host_bytes, t.disk_bytes, t.store_bytes)))
             for t in tiers]))
    problems = plan.memory_problems
    if problems:
        tables.append(("does not fit", ("problem",), [(p,) for p in problems]))
    return tables


def _expert_runs(group: list[RankMemory]) -> str:
    """The experts of ranks holding equally many, contiguous ones: "32 each: [0, 32) .. [224, 256)"."""
    first, last = group[0].experts, group[-1].experts
    assert first is not None and last is not None
    return f"{first[1] - first[0]} each: [{first[0]}, {first[1]}) .. [{last[0]}, {last[1]})"


def _same_figures(a: RankMemory, b: RankMemory) -> bool:
    return (a.weights, a.workspace_bytes, a.num_pages) == (b.weights, b.workspace_bytes, b.num_pages) and (
        (a.experts is None) == (b.experts is None)) and (
        a.experts is None or b.experts is None or a.experts[1] - a.experts[0] == b.experts[1] - b.experts[0])


def _per_page_layer(route: Route, layout: str) -> int:
    return sum(t.page_runs(layout).count for t in route.transfers)


def _transfers_table(route: Route) -> TableData:
    rows = []
    for dst_rank in range(route.dst.tp):
        incoming = route.transfers_to(dst_rank)
        sources = ", ".join(_source(route, t) for t in incoming)
        rows.append(
            (
                str(dst_rank),
                sources,
                str(sum(t.hnd.count for t in incoming)),
                str(sum(t.nhd.count for t in incoming)),
            )
        )
    note = " — source replica set drawn per request" if route.source_per_request else ""
    return (
        f"transfers {route.prefill} → {route.decode} (tp {route.src.tp} → {route.dst.tp}), "
        f"writes per page per layer{note}",
        ("decode tp", "from prefill tp", "HND", "NHD"),
        rows,
    )


def _source(route: Route, t: Transfer) -> str:
    text = str(t.src_tp_rank)
    if route.source_per_request:
        src = route.src
        shard = src.shard_of(t.src_tp_rank)
        choices = [src.rank_of(shard, s) for s in range(src.num_replica_sets)]
        text = f"one of {choices} per request"
    if not isinstance(t.heads, str):
        text += f" heads [{t.heads[0]}, {t.heads[1]})"
    return text


def plan_renderable(plan: Plan, num_tokens: int = 1024) -> Group:
    """A rich renderable (a group of tables) for the plan."""
    from rich.console import Group
    from rich.table import Table

    tables = []
    for title, headers, rows in plan_tables(plan, num_tokens):
        table = Table(title=title, title_justify="left", header_style="bold")
        for i, header in enumerate(headers):
            table.add_column(header, no_wrap=i == 0)
        for row in rows:
            table.add_row(*row)
        tables.append(table)
    return Group(*tables)


# a ceiling for `plan_text`, not the width printed: rich tables take their natural width, and the
# widest cell of a plan (a memory problem and its fixes) is about 350 characters
PLAN_TEXT_COLUMNS = 400


def plan_text(plan: Plan, num_tokens: int = 1024) -> str:
    """The plan as plain text: the tables a terminal shows (`plan_renderable`), without colour and
    never cut to 80 columns, for ``print(plan)``, ``str(plan)`` and IPython's text view.

    Args:
        plan: the plan to show.
        num_tokens: prompt length for the expected-writes column.

    Returns:
        The tables, one line per row, trailing spaces trimmed.
    """
    from rich.console import Console

    out = io.StringIO()
    # force_jupyter=False: in a kernel rich would display the tables as a cell output, not write them to out
    console = Console(file=out, width=PLAN_TEXT_COLUMNS, color_system=None, highlight=False, force_jupyter=False)
    console.print(plan_renderable(plan, num_tokens))
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def plan_html(plan: Plan, num_tokens: int = 1024) -> str:
    """The plan as HTML tables for Jupyter (no scripts, no external styles)."""
    parts = []
    for title, headers, rows in plan_tables(plan, num_tokens):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
        )
        parts.append(
            f"<table><caption style='text-align:left'><b>{html.escape(title)}</b></caption>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )
    return "<div class='disaggsdk-plan'>" + "".join(parts) + "</div>"
