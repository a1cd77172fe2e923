"""The "What has run where" tables (README.md, docs/hardware.md) claim only what the tests back.

Design. Each row of those tables makes two claims. Its CPU cell says the piece runs (any text but
"-" or "not run ..."), or not; its GPU cell says the piece has not run on a GPU ("never run",
"not run", "not yet run", "skip"), or that it has. `BACKING` names, for each row by its first cell,
the tests behind it: ``cpu``, the tests whose passing is what "runs" means, and ``gpu``, the
`gpu`-marked tests of the piece's GPU code. Each is a pytest node id or a prefix of some (a test
function stands for all its parameters). One collection of the named files (pytest itself, in a
subprocess: `tests.docs.collected_items`) then decides:

1. every row of both tables has an entry in `BACKING`, and every entry a row: a row added, renamed
   or removed fails until its tests are named here;
2. a CPU cell that says "runs" names tests, and each is collected, is not `gpu`-marked, and is not
   skipped on this machine by its skip markers (a `slow` one counts: `make test-all` runs it), so
   the row fails when its tests are deleted, renamed, or turned gpu-only;
3. a GPU cell that says "never run" names only `gpu`-marked tests, each in a file
   tools/gpu_check.sh runs (``pytest -m gpu`` over the files its ``grep -rl`` picks), each
   file listed in docs/gpu.md's "What is verified where" table, whose status must still say "not
   yet run": the table where a GPU run is to be recorded (docs/gpu.md says so), so recording one
   fails these rows until they say it too;
4. and such a cell fails on a machine where torch sees a CUDA GPU: the suite runs the `gpu` tests
   there, so "never run" is about to become false; record what they did, then change the rows.
A GPU cell that claims a run must name `gpu` tests whose docs/gpu.md rows no longer say "not yet run".
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.conftest import ROOT
from tests.docs.collected_items import OUTPUT_ENV

TABLE_PAGES = ("README.md", "docs/hardware.md")
GPU_RECORD_PAGE = "docs/gpu.md"
GPU_CHECK_SCRIPT = ROOT / "tools" / "gpu_check.sh"
# how tools/gpu_check.sh picks the files of gpu tests: `grep -rl "PATTERN" tests --include='*.py'`
GPU_CHECK_GREP = re.compile(r'grep -rl "([^"]+)" tests --include=\'\*\.py\'')
CPU_NOT_RUN = re.compile(r"^(?:-|not run\b.*)$")
GPU_NOT_RUN = re.compile(r"\b(?:never run|not run|not yet run|skip)\b")
GPU_RECORD_NOT_RUN = "not yet run"


@dataclass(frozen=True)
class Backing:
    """The tests behind one row: ``cpu`` back a CPU cell that says "runs"; ``gpu`` are the piece's
    `gpu` tests. Node ids, or prefixes of them (``tests/x.py::test_f`` covers ``test_f[a]``)."""

    cpu: tuple[str, ...] = ()
    gpu: tuple[str, ...] = ()


ENGINE_PARITY = (
    "tests/engine/test_parity_hf.py::test_greedy_tokens_equal_transformers",
    "tests/engine/test_expert_parallel_engine.py::test_dp_group_gives_tp1_greedy_tokens",
    "tests/engine/test_expert_parallel_engine.py::test_experts_over_one_engines_tp_ranks_give_tp1_greedy_tokens",
    "tests/engine/speculative/test_speculative_engine.py::test_greedy_tokens_with_speculation_equal_those_without",
)
DISAGGREGATED_PARITY = (
    "tests/launch/test_disagg_parity.py::test_disaggregated_tokens_equal_colocated_and_transformers",
    "tests/transfer/test_immediates.py::test_interleaved_requests_from_several_senders",
)
NCCL = ("tests/engine/test_nccl_tp.py::test_nccl_tp2_logits_equal_the_cpu_tp1_model",
        "tests/engine/test_nccl_tp.py::test_an_nccl_tp2_engine_gives_the_cpu_engines_greedy_tokens",
        "tests/engine/test_expert_dispatch.py::test_nccl_all_to_all_equals_the_reference")
FLASHINFER = ("tests/engine/attention/test_flashinfer_backend.py::test_flashinfer_matches_torch_ref",)
FLASHINFER_FP8 = ("tests/engine/attention/test_fp8_kv.py::test_flashinfer_reads_fp8_pages_as_the_reference",)
CUMEM_POOLS = ("tests/kv/pools/test_shared_memory_cuda.py::test_export_import_across_processes",
               "tests/kv/pools/test_rank_pool.py::test_cuda_pools_reach_the_head_as_the_memfd_twin_does")
CUDA_GRAPHS = (
    "tests/engine/test_cuda_graph_step.py::test_replayed_decode_logits_equal_the_eager_cuda_step",
    "tests/engine/test_cuda_graph_step.py::test_graph_decode_gives_the_eager_cuda_engine_tokens_and_close_to_the_cpu_engine",
    "tests/engine/test_cuda_graph_step.py::test_layer_counter_under_graph_replay_streams_every_layer_as_the_cpu_twin_does",
    "tests/engine/test_device_layer_counter.py::"
    "test_counter_bumped_inside_a_cuda_graph_is_read_by_a_polling_thread_as_the_cpu_twin_counts",
)
CUDA_UNITS = ("tests/launch/test_cuda_units.py::test_tiny_pd_on_one_gpu_gives_the_cpu_greedy_tokens",)
CUDA_UNITS_ON_CPU = (
    "tests/launch/test_cuda_units.py::test_a_cuda_unit_without_cuda_says_so_before_loading_and_leaves_nothing",
    "tests/launch/test_cuda_units.py::test_the_cli_says_it_in_one_line_exit_2_and_leaves_no_process",
)
SERVING = (
    "tests/serve/test_openai_server.py::test_openai_client_streams_a_chat_completion",
    "tests/bench/test_serve_bench.py::test_bench_against_a_live_server_has_vllm_fields_and_sane_values",
    "tests/launch/test_ray_runtime.py::test_cli_launch_on_ray_serves_the_openai_client_and_shows_placement",
    "tests/notebooks/test_notebooks.py::test_quickstart_runs_and_shows_the_plans_as_html",
)
HOST_MIRROR_GPU = (
    "tests/kv/pools/test_host_mirror.py::test_cuda_pools_stage_as_the_cpu_twin",
    "tests/launch/test_kv_registration.py::test_cuda_pools_staged_through_host_mirrors_read_as_the_host_twin",
)
FP8_GEMM = ("tests/engine/test_fp8_linear.py::test_cuda_blockwise_fp8_linear_matches_the_cpu_twin",)
REGISTER_DEVICE_MEMORY = ("tests/kv/pools/test_shared_memory_cuda.py::test_register_device_memory_with_the_transfer_engine",
                          "tests/launch/test_kv_registration.py::test_cuda_pools_are_registered_as_device_memory_and_take_writes_there")

# row (its first cell, as the tables write it) -> the tests behind it
BACKING: dict[str, Backing] = {
    "engine: Qwen3, Qwen3-MoE, DeepSeek-V3 with MTP; tp, dp, ep": Backing(
        cpu=ENGINE_PARITY,
        gpu=("tests/engine/modeling/test_models_gpu.py::test_cuda_model_matches_cpu", *NCCL, *FLASHINFER)),
    "KV over libfabric `shm`, `tcp;ofi_rxm` between processes": Backing(cpu=DISAGGREGATED_PARITY),
    "libfabric `verbs`, `efa`": Backing(),
    "launch a `device: cuda` spec: units on their planned GPUs, cuMem KV pools, NCCL, FlashInfer, CUDA-graph decode":
        Backing(cpu=CUDA_UNITS_ON_CPU, gpu=(*CUDA_UNITS, *CUMEM_POOLS, *NCCL, *FLASHINFER, *CUDA_GRAPHS)),
    "KV staged through host mirrors (`transport.kv_staging: host`, the GPU pools' fallback)": Backing(
        cpu=("tests/launch/test_disagg_parity.py::test_tokens_through_host_mirrors_equal_colocated",
             "tests/launch/test_kv_registration.py::test_host_staging_registers_mirrors_and_copies_into_them"),
        gpu=HOST_MIRROR_GPU),
    "FP8 GEMM, libfabric registration of GPU memory": Backing(gpu=(*FP8_GEMM, *REGISTER_DEVICE_MEMORY)),
    "launch, serve, bench, Ray, notebooks": Backing(cpu=SERVING),
    "moving decoding requests with their KV, live role changes, `serve.autoscale` ([docs/migration.md](docs/migration.md))":
        Backing(cpu=(
            "tests/launch/test_request_moves.py::test_moved_requests_continue_exactly_and_move_their_pages_bytes",
            "tests/launch/test_role_changes.py::test_units_change_role_live_and_every_request_gets_its_tokens",
            "tests/launch/test_role_changes.py::test_the_autoscale_policy_turns_a_decode_unit_when_first_tokens_miss",
        )),
    "KV tiers: host, disk, shared store ([docs/kv_tiers.md](docs/kv_tiers.md))": Backing(
        cpu=("tests/engine/test_kv_tiers_engine.py::test_evicted_pages_come_back_from_the_host_tier_with_the_same_tokens",
             "tests/launch/test_kv_tiers_launch.py::test_a_prefix_prefill_a_computed_is_served_to_prefill_b_from_the_store"),
        gpu=("tests/engine/test_kv_tiers_engine.py::"
             "test_pool_pages_of_a_cuda_pool_go_through_pinned_memory_and_equal_the_cpu_twins",)),
    # docs/hardware.md's rows beyond the README's
    "attention": Backing(
        cpu=("tests/engine/attention/test_cpu_backend.py", "tests/engine/attention/test_torch_ref.py"),
        gpu=(*FLASHINFER, *FLASHINFER_FP8)),
    "collectives, expert all-to-all": Backing(
        cpu=("tests/engine/test_tp_group.py::test_tp2_equals_tp1_and_workers_are_reaped",
             "tests/engine/test_expert_dispatch.py::test_gloo_all_to_all_equals_the_reference_and_a_dense_moe"),
        gpu=NCCL),
    "KV pool shared across processes": Backing(
        cpu=("tests/kv/pools/test_rank_pool.py::test_memfd_pools_reach_the_head_with_their_bytes",
             "tests/kv/pools/test_shared_memory.py::test_child_writes_into_parent_region"),
        gpu=CUMEM_POOLS),
    "KV transfer": Backing(cpu=DISAGGREGATED_PARITY),
    "FP8": Backing(
        cpu=("tests/engine/test_fp8_checkpoint.py::test_greedy_tokens_equal_transformers_on_the_dequantized_model",
             "tests/engine/test_fp8_kv_engine.py::"
             "test_fp8_pages_hold_one_byte_an_element_and_both_cpu_backends_give_the_same_tokens"),
        gpu=(*FP8_GEMM, *FLASHINFER_FP8)),
    "decode step": Backing(
        cpu=("tests/engine/test_compiled_step.py::test_compiled_moe_and_mla_models_generate_what_eager_does",),
        gpu=CUDA_GRAPHS),
    "launch, serve, bench, Ray, simulator, notebooks": Backing(
        cpu=(*SERVING, *CUDA_UNITS_ON_CPU, "tests/sim/test_simulator.py"),
        gpu=CUDA_UNITS),
}


@dataclass(frozen=True)
class Row:
    """One row of a "What has run where" table."""

    page: str
    piece: str  # the first cell: the key into BACKING
    cpu: str
    gpu: str

    @property
    def claims_cpu_run(self) -> bool:
        return CPU_NOT_RUN.match(self.cpu) is None

    @property
    def claims_gpu_not_run(self) -> bool:
        return self.gpu == "-" or GPU_NOT_RUN.search(self.gpu) is not None


def table_cells(line: str) -> list[str]:
    """The cells of a Markdown table line (``\\|`` inside a cell is not a border)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table of ``text``: its rows of cells, the header first, the ``---`` line dropped."""
    found, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if not re.fullmatch(r"\|(?:\s*:?-+:?\s*\|)+", line.strip()):
                current.append(table_cells(line))
        elif current:
            found.append(current)
            current = []
    return found


def what_ran_where_rows(page: str, text: str) -> list[Row]:
    """The rows of ``text``'s table whose header's second and third cells are the CPU and the GPU."""
    for table in tables(text):
        header = table[0]
        if len(header) == 3 and header[1].startswith("CPU") and header[2].startswith("NVIDIA GPU"):
            return [Row(page, *cells) for cells in table[1:]]
    return []


def all_rows() -> list[Row]:
    rows = [row for page in TABLE_PAGES for row in what_ran_where_rows(page, (ROOT / page).read_text(encoding="utf-8"))]
    assert rows, f"no table with CPU and NVIDIA GPU columns in {TABLE_PAGES}"
    return rows


def gpu_record_statuses(text: str) -> dict[str, list[str]]:
    """docs/gpu.md's "What is verified where": each test file its ``gpu`` test column names -> the
    status of every row that names it."""
    statuses: dict[str, list[str]] = {}
    for table in tables(text):
        header = [cell.lower() for cell in table[0]]
        if "`gpu` test" not in header or "status" not in header:
            continue
        test_column, status_column = header.index("`gpu` test"), header.index("status")
        for cells in table[1:]:
            for test_file in re.findall(r"tests/[\w/]+\.py", cells[test_column]):
                statuses.setdefault(test_file, []).append(cells[status_column])
    return statuses


def matching(items: list[dict], test: str) -> list[dict]:
    """The collected items ``test`` names: its node id, or every node id it is a prefix of."""
    return [item for item in items if item["nodeid"] == test or item["nodeid"].startswith((test + "::", test + "["))]


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> list[dict]:
    """Every item pytest collects from the files `BACKING` names, with its markers and whether it skips here."""
    files = sorted({test.split("::")[0] for backing in BACKING.values() for test in backing.cpu + backing.gpu})
    output = tmp_path_factory.mktemp("collected") / "items.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p",
         "tests.docs.collected_items", "-m", "slow or not slow", *files],
        cwd=ROOT, env={**os.environ, OUTPUT_ENV: str(output)}, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"collecting the backing tests failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    found = json.loads(output.read_text(encoding="utf-8"))
    assert not found["skipped_files"], f"these files skip as a whole here: {found['skipped_files']}"
    return found["items"]


def cpu_problems(row: Row, backing: Backing, items: list[dict]) -> list[str]:
    """Why ``row``'s CPU cell is not backed: it says "runs" and a test behind it is missing, gpu-only
    or skipped here; or it names no test."""
    if not row.claims_cpu_run:
        return []
    if not backing.cpu:
        return [f"{row.page}: {row.piece!r} says the CPU runs it ({row.cpu!r}) but names no test"]
    problems = []
    for test in backing.cpu:
        found = matching(items, test)
        runnable = [item for item in found if not item["gpu"] and not item["skips_here"]]
        if not found:
            problems.append(f"{row.page}: {row.piece!r}: {test} is not collected (renamed or removed?)")
        elif not runnable:
            problems.append(f"{row.page}: {row.piece!r}: {test} does not run on this CPU (gpu-marked or skipped)")
    return problems


def gpu_problems(row: Row, backing: Backing, items: list[dict], record: dict[str, list[str]],
                 gpu_check_picks: set[str]) -> list[str]:
    """Why ``row``'s GPU cell is not backed (checks 3 and the last paragraph of the module docstring)."""
    problems = []
    for test in backing.gpu:
        found = matching(items, test)
        test_file = test.split("::")[0]
        if not found:
            problems.append(f"{row.page}: {row.piece!r}: {test} is not collected (renamed or removed?)")
        elif not all(item["gpu"] for item in found):
            problems.append(f"{row.page}: {row.piece!r}: {test} is not `gpu`-marked")
        if test_file not in gpu_check_picks:
            problems.append(f"{row.page}: {row.piece!r}: tools/gpu_check.sh does not run {test_file} (its grep skips it)")
        statuses = record.get(test_file)
        if not statuses:
            problems.append(f"{row.page}: {row.piece!r}: {GPU_RECORD_PAGE}'s table lists no row for {test_file}")
        elif row.claims_gpu_not_run and not all(GPU_RECORD_NOT_RUN in status for status in statuses):
            problems.append(f"{row.page}: {row.piece!r} says {row.gpu!r} but {GPU_RECORD_PAGE} records a run "
                            f"of {test_file}: {statuses}")
        elif not row.claims_gpu_not_run and all(GPU_RECORD_NOT_RUN in status for status in statuses):
            problems.append(f"{row.page}: {row.piece!r} claims a GPU run ({row.gpu!r}) that {GPU_RECORD_PAGE} "
                            f"does not record for {test_file}")
    if not row.claims_gpu_not_run and not backing.gpu:
        problems.append(f"{row.page}: {row.piece!r} claims a GPU run ({row.gpu!r}) and names no gpu test")
    return problems


def files_gpu_check_picks() -> set[str]:
    """The test files tools/gpu_check.sh runs: those its grep for the gpu marker picks (the pattern is
    read from the script, and not spelled here, so that this file is not one of them)."""
    found = GPU_CHECK_GREP.search(GPU_CHECK_SCRIPT.read_text(encoding="utf-8"))
    assert found, "tools/gpu_check.sh picks its test files another way now: teach files_gpu_check_picks"
    pattern = found.group(1)
    return {str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("*.py")
            if pattern in path.read_text(encoding="utf-8")}


def test_every_row_has_its_tests_named_and_every_entry_a_row():
    pieces = {row.piece for row in all_rows()}
    assert not pieces - BACKING.keys(), f"rows without their tests in BACKING: {sorted(pieces - BACKING.keys())}"
    assert not BACKING.keys() - pieces, f"BACKING entries no table has: {sorted(BACKING.keys() - pieces)}"


def test_a_cpu_cell_that_says_runs_rests_on_tests_that_run_here(collected):
    problems = [p for row in all_rows() for p in cpu_problems(row, BACKING[row.piece], collected)]
    assert not problems, "\n".join(problems)


def test_a_gpu_cell_rests_on_gpu_tests_that_docs_gpu_records(collected):
    record = gpu_record_statuses((ROOT / GPU_RECORD_PAGE).read_text(encoding="utf-8"))
    picks = files_gpu_check_picks()
    problems = [p for row in all_rows() for p in gpu_problems(row, BACKING[row.piece], collected, record, picks)]
    assert not problems, "\n".join(problems)


def test_never_run_on_a_gpu_is_not_claimed_where_the_gpu_tests_run():
    if importlib.util.find_spec("torch") is None:
        return  # no torch, no gpu test runs here: "never run" stays true
    import torch

    if not torch.cuda.is_available():
        return  # the gpu tests skip here: "never run" stays true
    said = [f"{row.page}: {row.piece!r}: {row.gpu!r}" for row in all_rows() if row.claims_gpu_not_run and BACKING[row.piece].gpu]
    assert not said, ("torch sees a CUDA GPU, so this run runs the gpu tests these rows say never ran; record their "
                      f"outcome in {GPU_RECORD_PAGE}'s table and change the rows:\n" + "\n".join(said))


# the checks can fail


ITEMS = [
    {"nodeid": "tests/a.py::test_cpu[x]", "gpu": False, "slow": False, "skips_here": False},
    {"nodeid": "tests/a.py::test_cpu_that_skips", "gpu": False, "slow": False, "skips_here": True},
    {"nodeid": "tests/g.py::test_on_gpu", "gpu": True, "slow": False, "skips_here": True},
]


def test_a_row_that_says_runs_fails_without_tests_or_with_missing_or_gpu_only_ones():
    row = Row("README.md", "piece", "runs", "not run")
    assert cpu_problems(row, Backing(cpu=("tests/a.py::test_cpu",)), ITEMS) == []
    assert "names no test" in cpu_problems(row, Backing(), ITEMS)[0]
    assert "not collected" in cpu_problems(row, Backing(cpu=("tests/a.py::test_gone",)), ITEMS)[0]
    assert "does not run on this CPU" in cpu_problems(row, Backing(cpu=("tests/g.py::test_on_gpu",)), ITEMS)[0]
    assert "does not run on this CPU" in cpu_problems(row, Backing(cpu=("tests/a.py::test_cpu_that_skips",)), ITEMS)[0]
    assert cpu_problems(Row("README.md", "piece", "not run (no RDMA device)", "not run"), Backing(), ITEMS) == []


def test_a_row_that_says_never_run_fails_once_docs_gpu_records_a_run():
    row = Row("README.md", "piece", "-", "written, **never run**")
    backing = Backing(gpu=("tests/g.py::test_on_gpu",))
    not_run = {"tests/g.py": ["written, not yet run on a GPU"]}
    assert gpu_problems(row, backing, ITEMS, not_run, {"tests/g.py"}) == []
    ran = {"tests/g.py": ["passed on an H100, driver 570"]}
    assert "records a run" in gpu_problems(row, backing, ITEMS, ran, {"tests/g.py"})[0]
    assert "lists no row" in gpu_problems(row, backing, ITEMS, {}, {"tests/g.py"})[0]
    assert "does not run" in gpu_problems(row, backing, ITEMS, not_run, set())[0]
    not_gpu = Backing(gpu=("tests/a.py::test_cpu",))
    assert "not `gpu`-marked" in gpu_problems(row, not_gpu, ITEMS, {"tests/a.py": ["not yet run"]}, {"tests/a.py"})[0]
    claims_a_run = Row("README.md", "piece", "-", "runs on an H100")
    assert "does not record" in gpu_problems(claims_a_run, backing, ITEMS, not_run, {"tests/g.py"})[0]
    assert gpu_problems(claims_a_run, backing, ITEMS, ran, {"tests/g.py"}) == []


def test_the_tables_are_found_and_read():
    text = "x\n\n| | CPU (2 cores) | NVIDIA GPU |\n|---|---|---|\n| a `x\\|y` | runs | never run |\n\nafter\n"
    (row,) = what_ran_where_rows("README.md", text)
    assert (row.piece, row.cpu, row.gpu) == ("a `x\\|y`", "runs", "never run")
    assert row.claims_cpu_run and row.claims_gpu_not_run
    record = gpu_record_statuses("| GPU piece | `gpu` test | status |\n|---|---|---|\n"
                                 "| pools | `tests/memory/test_x.py` (a), `tests/y.py` | written, not yet run on a GPU |\n")
    assert record == {"tests/memory/test_x.py": ["written, not yet run on a GPU"],
                      "tests/y.py": ["written, not yet run on a GPU"]}
