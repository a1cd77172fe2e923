"""Calibration: the fit recovers known rates; the real engine is timed and the profile is found by name."""

import attrs
import pytest

from disaggsdk.calibrate.engine_profile import StepSample, fit_profile, save_profile, time_engine
from disaggsdk.models import resolve_model
from disaggsdk.sim.cost_model import StepCostModel, prefill_context_pairs
from disaggsdk.sim.hardware import load_profile

ARCH = resolve_model("qwen3-coder-tiny")


def test_fit_recovers_the_rates_that_generated_the_samples():
    truth = attrs.evolve(fit_profile(ARCH, [StepSample(1, 1, 10, 10, 0.01)])[0],
                         bf16_tflops=0.08, fp8_tflops=0.08, hbm_gb_per_s=6.0, step_overhead_ms=2.5)
    cost = StepCostModel(ARCH, truth, weight_dtype="float32", kv_dtype="float32")
    samples = [StepSample(n, 1, prefill_context_pairs(n, 0), n, cost.step_time_s(n, 1, prefill_context_pairs(n, 0), n))
               for n in (32, 256, 1024, 2048)]
    samples += [StepSample(b, b, b * 300, b * 300, cost.step_time_s(b, b, b * 300, b * 300)) for b in (1, 8, 32)]
    fitted, rms = fit_profile(ARCH, samples)
    assert rms < 0.03
    assert fitted.bf16_tflops == pytest.approx(0.08, rel=0.15)
    assert fitted.step_overhead_ms == pytest.approx(2.5, rel=0.15)


def test_time_the_engine_and_find_the_profile_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("DISAGGSDK_HOME", str(tmp_path))
    samples = time_engine("qwen3-tiny", prefill_lens=(16, 64), decode_batches=(1, 2), decode_contexts=(16,),
                          decode_steps=3, repeats=1)
    assert len(samples) == 4 and all(s.seconds > 0 for s in samples)
    profile, rms = fit_profile(resolve_model("qwen3-tiny"), samples)
    save_profile(profile, tmp_path / "profiles" / "cpu-local.yaml")
    loaded = load_profile("cpu-local")
    assert loaded.bf16_tflops == pytest.approx(profile.bf16_tflops, rel=1e-5)
    assert "fitted" in loaded.sources["rates"]


def test_missing_cpu_profile_says_to_calibrate(tmp_path, monkeypatch):
    monkeypatch.setenv("DISAGGSDK_HOME", str(tmp_path))
    from disaggsdk.errors import SpecError

    with pytest.raises(SpecError, match="run `disaggsdk calibrate`"):
        load_profile("cpu-local")


def test_rounds_take_the_median_of_whole_grids():
    samples = time_engine("qwen3-tiny", prefill_lens=(16,), decode_batches=(1,), decode_contexts=(16,),
                          decode_steps=2, repeats=1, rounds=3)
    assert [(s.num_tokens, s.num_sequences) for s in samples] == [(16, 1), (1, 1)]
    assert all(s.seconds > 0 for s in samples)


def test_cpu_time_splits_into_per_token_and_per_request_costs():
    from disaggsdk.calibrate.serving import _per_token_and_request

    # 10 requests: 2 ms each plus 0.5 ms a token; 320 tokens in the long run, 10 in the short one
    long_s, short_s = (10 * 2 + 320 * 0.5) * 1e-3, (10 * 2 + 10 * 0.5) * 1e-3
    assert _per_token_and_request(long_s, 320, short_s, 10, 10) == pytest.approx((0.5, 2.0))
    assert _per_token_and_request(0.001, 320, 0.002, 10, 10)[0] == 0.0  # noise never goes negative


def test_calibrate_rejects_a_bad_round_count(run_cli):
    result = run_cli("calibrate", "--rounds", "0")
    assert result.returncode == 2 and "--rounds" in result.stderr and "Traceback" not in result.stderr


def test_the_timed_prefills_compute_every_token(monkeypatch):
    """Each prefill of the grid repeats one prompt: with a prefix cache, every repeat after the
    first would compute its last token only and the fit would see prefill ten times too fast."""
    from disaggsdk.engine import llm_engine

    configs = []

    class Recording(llm_engine.LLMEngine):
        def __init__(self, model, config):
            configs.append(config)
            super().__init__(model, config)

    monkeypatch.setattr(llm_engine, "LLMEngine", Recording)
    samples = time_engine("qwen3-tiny", prefill_lens=(16,), decode_batches=(1,), decode_contexts=(16,),
                          decode_steps=2, repeats=1)
    assert [c.prefix_caching for c in configs] == [False]
    assert samples[0].num_tokens == 16 and samples[0].context_pairs == 16 * 17 / 2
