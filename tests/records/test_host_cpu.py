"""The CPU a figure was taken on, from /proc/cpuinfo: named in bench JSON, start-up lines and --version -v."""

from __future__ import annotations

from disaggsdk.records.host_cpu import host_cpu, parse_cpuinfo

ZEN5 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC 9R45 48-Core Processor
flags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: something else
flags\t\t: amx_bf16
"""


def test_the_first_processor_names_the_cpu_and_the_isa_the_kernels_choose_between():
    cpu = parse_cpuinfo(ZEN5, usable_cpus=2)
    assert (cpu.model_name, cpu.vendor, cpu.family, cpu.model) == ("AMD EPYC 9R45 48-Core Processor", "AuthenticAMD",
                                                                    26, 2)
    assert cpu.isa == ("avx2", "avx512f", "avx512_bf16", "avx512_vnni") and not cpu.has_amx  # processor 1 ignored
    assert cpu.line() == ("AMD EPYC 9R45 48-Core Processor (AuthenticAMD family 26 model 2), 2 CPUs usable; "
                          "avx2 avx512f avx512_bf16 avx512_vnni")
    assert cpu.as_json()["amx"] is False and cpu.as_json()["isa"] == list(cpu.isa)


def test_an_unreadable_cpuinfo_gives_unknown_fields(tmp_path):
    cpu = host_cpu(str(tmp_path / "missing"))
    assert (cpu.model_name, cpu.family, cpu.isa) == ("unknown", -1, ())
    assert cpu.usable_cpus >= 1


def test_this_machine_is_read():
    with open("/proc/cpuinfo") as f:
        first_model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    assert host_cpu().model_name == first_model
