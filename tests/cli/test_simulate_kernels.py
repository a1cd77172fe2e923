"""`disaggsdk simulate --kernels`: which measured kernel tables a GPU profile's steps read, and the JSON says so."""

from __future__ import annotations

import json

from disaggsdk.cli.main import main

BASE = ["simulate", "specs/r1_tp.yaml", "--request-rate", "2", "--duration-s", "20", "--json"]


def sources_of(argv: list[str], capsys) -> dict[str, str]:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)["config"]["kernel_sources"]


def test_the_profiles_tables_by_default_another_framework_or_the_block_roofline_on_request(capsys):
    default = sources_of(BASE, capsys)
    assert "h200_sxm/gemm/sglang/0.5.14" in default["gemm"] and default["rmsnorm"].startswith("roofline (profile h200)")
    vllm = sources_of(BASE + ["--kernels", "vllm@0.24.0"], capsys)
    assert "h200_sxm/gemm/vllm/0.24.0" in vllm["gemm"]
    assert sources_of(BASE + ["--kernels", "roofline"], capsys) == {
        "step": "block roofline of profile h200 (sim.cost_model)"}


def test_a_bad_value_or_tables_for_a_cpu_profile_are_one_line_and_exit_2(capsys, tmp_path):
    capsys.readouterr()
    assert main(BASE + ["--kernels", "sglang"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: --kernels 'sglang': use FRAMEWORK@VERSION")
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text("name: my-cpu\nmemory_gb: 8\nhbm_gb_per_s: 50\nbf16_tflops: 1\nfp8_tflops: 1\nnvlink_gb_per_s: 10\n"
                   "nics_per_node: 1\nnic_gbps: 10\n")
    assert main(["simulate", "specs/tiny_local.yaml", "--profile", str(cpu), "--kernels", "sglang@0.5.14"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --kernels sglang@0.5.14: profile my-cpu is no GPU the kernel tables cover"), err
