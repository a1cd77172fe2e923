"""Our models against transformers in float32 (tp=1): forward logits, chunked prefill, greedy
decoding with a KV cache, YaRN rope, and the per-layer callback."""

from __future__ import annotations

import pytest
import torch
from model_oracle import ContiguousAttention, make_batch

from disaggsdk.engine.modeling import build_model
from disaggsdk.engine.parallel import TensorParallel
from tests.hf_checkpoints import hf_model, save_hf_checkpoint

FAMILIES = ["qwen3-tiny", "qwen3-coder-tiny", "deepseek-r1-tiny"]
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (transformers model, our model loaded from its save_pretrained directory)."""
    out = {}
    for name in FAMILIES:
        directory = tmp_path_factory.mktemp(name)
        hf = save_hf_checkpoint(name, directory)
        out[name] = (hf, build_model(str(directory), TensorParallel()))
    return out


def random_prompts(lengths, seed=1, vocab=512):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def run(model, attn, chunks, starts, on_layer_done=None):
    batch = make_batch(chunks, starts, on_layer_done)
    attn.plan(batch)
    with torch.no_grad():
        return model.compute_logits(model(batch, attn))


@pytest.mark.parametrize("name", FAMILIES)
def test_batched_prefill_logits_match_transformers(checkpoints, name):
    hf, ours = checkpoints[name]
    prompts = random_prompts([5, 23, 1, 12])
    logits = run(ours, ContiguousAttention(), prompts, [0] * len(prompts))
    offset = 0
    with torch.no_grad():
        for p in prompts:
            ref = hf(torch.tensor([p])).logits[0]
            torch.testing.assert_close(logits[offset : offset + len(p)], ref, **TOL)
            offset += len(p)


@pytest.mark.parametrize("name", FAMILIES)
def test_chunked_prefill_equals_one_shot(checkpoints, name):
    _, ours = checkpoints[name]
    (a, b) = random_prompts([19, 11], seed=2)
    whole = run(ours, ContiguousAttention(), [a, b], [0, 0])
    attn = ContiguousAttention()
    first = run(ours, attn, [a[:7], b[:4]], [0, 0])
    second = run(ours, attn, [a[7:], b[4:]], [7, 4])
    torch.testing.assert_close(torch.cat([first[:7], second[:12]]), whole[:19], **TOL)
    torch.testing.assert_close(torch.cat([first[7:], second[12:]]), whole[19:], **TOL)


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_decode_with_cache_matches_transformers_generate(checkpoints, name):
    hf, ours = checkpoints[name]
    prompts = random_prompts([6, 15, 3], seed=3)
    num_new = 10
    attn = ContiguousAttention()
    logits = run(ours, attn, prompts, [0] * len(prompts))
    ends = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    tokens = [[t] for t in logits[ends].argmax(-1).tolist()]
    for step in range(num_new - 1):
        starts = [len(p) + step for p in prompts]
        logits = run(ours, attn, [[t[-1]] for t in tokens], starts)
        for t, nxt in zip(tokens, logits.argmax(-1).tolist()):
            t.append(nxt)
    for p, got in zip(prompts, tokens):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=num_new, min_new_tokens=num_new, do_sample=False,
                          attention_mask=torch.ones(1, len(p), dtype=torch.long))
        assert got == ref[0, len(p):].tolist()


def test_layer_callback_runs_once_per_layer_in_order(checkpoints):
    _, ours = checkpoints["deepseek-r1-tiny"]
    seen = []
    run(ours, ContiguousAttention(), random_prompts([4]), [0], on_layer_done=lambda layer, _out: seen.append(layer))
    assert seen == list(range(ours.arch.num_layers))


def test_deepseek_yarn_rope_matches_transformers(tmp_path, monkeypatch):
    """The real R1 rope (YaRN, mscale) on a tiny model, with prompts past the original window."""
    from disaggsdk.models import catalog

    config = catalog.catalog_config("deepseek-r1-tiny")
    config["rope_scaling"] = {
        "type": "yarn", "factor": 8, "original_max_position_embeddings": 16,
        "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 1.0,
    }
    monkeypatch.setitem(catalog.CATALOG, "deepseek-r1-tiny", config)
    hf = save_hf_checkpoint("deepseek-r1-tiny", tmp_path)
    ours = build_model(str(tmp_path), TensorParallel())
    assert ours.layers[0].self_attn.sm_scale == pytest.approx(hf.model.layers[0].self_attn.scaling)
    assert ours.rotary.attention_factor == pytest.approx(hf.model.rotary_emb.attention_scaling)
    prompt = random_prompts([40], seed=4)[0]
    logits = run(ours, ContiguousAttention(), [prompt], [0])
    with torch.no_grad():
        torch.testing.assert_close(logits, hf(torch.tensor([prompt])).logits[0], **TOL)


def test_hf_helper_randomises_constants():
    # The parity tests above would not notice a swapped norm weight if all norms were ones.
    model = hf_model("deepseek-r1-tiny")
    norm = model.model.layers[0].input_layernorm.weight
    assert not torch.allclose(norm, torch.ones_like(norm))
    assert model.model.layers[1].mlp.gate.e_score_correction_bias.abs().sum() > 0


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("qwen3-tiny", {"tie_word_embeddings": True}),
        ("qwen3-coder-tiny", {"mlp_only_layers": [0, 2], "norm_topk_prob": False}),
        ("qwen3-coder-tiny", {"decoder_sparse_step": 2}),
        ("deepseek-r1-tiny", {"q_lora_rank": None, "first_k_dense_replace": 0}),
        ("deepseek-r1-tiny", {"rope_interleave": False, "n_shared_experts": 2, "norm_topk_prob": False}),
        ("deepseek-r1-tiny", {"n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0}),
    ],
)
def test_config_variants_match_transformers(tmp_path, name, overrides):
    hf = save_hf_checkpoint(name, tmp_path, **overrides)
    ours = build_model(str(tmp_path), TensorParallel())
    assert {k: ours.arch.hf_config.get(k) for k in overrides} == overrides  # the variant reached us
    prompts = random_prompts([13, 6], seed=5)
    logits = run(ours, ContiguousAttention(), prompts, [0, 0])
    with torch.no_grad():
        ref = torch.cat([hf(torch.tensor([p])).logits[0] for p in prompts])
    torch.testing.assert_close(logits, ref, **TOL)
