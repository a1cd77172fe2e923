"""kernel_db: which measured tables a profile names, which version directories answer, and staying lazy."""

import textwrap

import pytest

from disaggsdk.errors import SpecError
from disaggsdk.sim.hardware import load_profile
from disaggsdk.sim.kernel_db import KernelDb, KernelDbRef, KernelDbUnavailable, version_key

H200 = load_profile("h200")


def test_gpu_profiles_name_their_kernel_database():
    assert H200.kernel_db == KernelDbRef("h200", "sglang", "0.5.14")
    assert H200.kernel_db.package_system == "h200_sxm"
    assert load_profile("h100").kernel_db.package_system == "h100_sxm"
    assert "aiconfigurator-core" in H200.sources["kernels"]


def test_a_profiles_kernel_db_is_typed_and_checked(tmp_path):
    text = (textwrap.dedent("""\
        name: mine
        hbm_gb_per_s: 4800
        bf16_tflops: 989
        fp8_tflops: 1979
        nvlink_gb_per_s: 450
        nics_per_node: 8
        nic_gbps: 400
        """))
    plain = tmp_path / "plain.yaml"
    plain.write_text(text)
    assert load_profile(plain).kernel_db is None
    wrong_framework = tmp_path / "tgi.yaml"
    wrong_framework.write_text(text + "kernel_db: {system: h200, framework: tgi, version: '1.0'}\n")
    with pytest.raises(SpecError, match="tgi.yaml: kernel_db.framework: 'tgi' is not one of sglang, vllm, trtllm"):
        load_profile(wrong_framework)
    missing_version = tmp_path / "short.yaml"
    missing_version.write_text(text + "kernel_db: {system: h200, framework: vllm}\n")
    with pytest.raises(SpecError, match=r"kernel_db: give \['framework', 'system', 'version'\] and optionally"):
        load_profile(missing_version)
    serial = tmp_path / "serial.yaml"
    serial.write_text(text + "kernel_db: {system: h200, framework: sglang, version: '0.5.14', overlap_scheduler: false}\n")
    assert load_profile(serial).kernel_db == KernelDbRef("h200", "sglang", "0.5.14", overlap_scheduler=False)
    bad_overlap = tmp_path / "bad.yaml"
    bad_overlap.write_text(text + "kernel_db: {system: h200, framework: sglang, version: '0.5.14', overlap_scheduler: 1}\n")
    with pytest.raises(SpecError, match="kernel_db.overlap_scheduler: give true or false, got 1"):
        load_profile(bad_overlap)


def test_a_kernels_option_names_a_framework_and_version_or_the_roofline():
    assert KernelDbRef.from_option("vllm@0.24.0", "h200") == KernelDbRef("h200", "vllm", "0.24.0")
    assert KernelDbRef.from_option("roofline", "h200") is None
    with pytest.raises(SpecError, match="FRAMEWORK@VERSION"):
        KernelDbRef.from_option("sglang", "h200")


def test_versions_order_as_releases_do():
    ordered = ["0.5.6.post2", "0.5.9", "0.5.10", "0.5.14", "1.3.0rc20", "1.3.0rc23", "1.3.0", "1.3.0.post1"]
    assert sorted(ordered, key=version_key) == ordered
    assert version_key("gitkeep") is None


def test_a_table_comes_from_the_named_version_or_an_older_one_never_a_newer_one():
    db = KernelDb.open(H200.kernel_db)
    assert [f.version for f in db.versions("gemm", "gemm_perf")] == ["0.5.14"]
    # 0.5.14 has no DeepEP tables: 0.5.12 measured one node, 0.5.6.post2 up to 8 nodes
    assert [f.version for f in db.versions("comm", "wideep_deepep_normal_perf")] == ["0.5.12", "0.5.6.post2"]
    older = KernelDb.open(KernelDbRef("h200", "sglang", "0.5.10"))
    assert [f.version for f in older.versions("moe", "moe_perf")] == ["0.5.10"]  # not 0.5.14
    assert [f.version for f in db.versions("comm", "nccl_perf", "nccl")] == ["2.26.2", "2.23"]  # the system's NCCL first
    assert db.status(db.versions("comm", "wideep_deepep_normal_perf")[0]) == "partial"
    assert "collected partially" in db.describe(db.versions("comm", "wideep_deepep_normal_perf")[0])


def test_a_gpu_without_tables_is_unavailable_in_one_line():
    with pytest.raises(KernelDbUnavailable, match="has no kernel tables for h100_pcie") as raised:
        KernelDb.open(KernelDbRef("h100_pcie", "sglang", "0.5.14"))
    assert "\n" not in str(raised.value) and str(raised.value).endswith("using the roofline for every kernel")
