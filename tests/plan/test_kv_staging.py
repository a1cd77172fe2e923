"""The plan says where KV pages are read and written, as `launch.kv_registration` will decide."""

from disaggsdk.plan.kv_staging import kv_staging_summary
from disaggsdk.spec import Hardware, Spec
from disaggsdk.spec.kv import Transport


def test_each_device_and_provider_says_how_pages_reach_the_wire():
    assert "host memory (memfd)" in kv_staging_summary(Spec(model="qwen3-tiny", device="cpu",
                                                            hardware=Hardware(gpu="cpu")))
    assert "tcp cannot register device memory" in kv_staging_summary(Spec(transport=Transport(provider="tcp")))
    assert "(efa, FI_HMEM_CUDA)" in kv_staging_summary(Spec(transport=Transport(provider="efa")))
    assert "each unit logs which" in kv_staging_summary(Spec(transport=Transport(provider="shm")))
    assert "host mirrors" in kv_staging_summary(Spec(transport=Transport(kv_staging="host")))
    assert "launch fails" in kv_staging_summary(Spec(transport=Transport(provider="shm", kv_staging="direct")))


def test_plan_shows_it_with_the_routes():
    from disaggsdk.plan import make_plan
    from disaggsdk.plan.render import plan_tables

    titles = [t[0] for t in plan_tables(make_plan(Spec(transport=Transport(provider="tcp"))))]
    assert any("staged through host mirrors" in t for t in titles)


def test_the_spec_settles_mirroring_except_auto_on_a_gpu():
    from disaggsdk.plan.kv_staging import mirror_wanted

    cpu = Spec(model="qwen3-tiny", device="cpu", hardware=Hardware(gpu="cpu"))
    assert mirror_wanted(cpu) is False
    assert mirror_wanted(Spec(transport=Transport(kv_staging="host"))) is True
    assert mirror_wanted(Spec(transport=Transport(kv_staging="direct"))) is False
    assert mirror_wanted(Spec(transport=Transport(provider="tcp"))) is None  # launch finds tcp has no FI_HMEM
