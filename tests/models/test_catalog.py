"""Model facts: real numbers from the published configs, tiny variants, config.json reading."""

import json
from pathlib import Path

import attrs
import pytest

from disaggsdk.errors import ModelError
from disaggsdk.models import TINY_VARIANT, arch_from_hf_config, catalog_config, catalog_names, resolve_model
from disaggsdk.models.quantization import block_fp8_of

# The models' published config.json, verbatim: NVIDIA's copies of the Hugging Face files (Qwen/Qwen3-32B,
# Qwen/Qwen3-32B-FP8, deepseek-ai/DeepSeek-R1) as aiconfigurator-core 0.12.0 ships them in its
# model_configs/ folder (Apache-2.0), taken 2026-12-07; their numbers are also those other public copies of
# the Qwen3-32B file quote (hidden 5120, 64 layers, 64 heads, 8 KV heads, head_dim 128, intermediate
# 25600, vocab 151936).
PUBLISHED_CONFIGS = Path(__file__).parent / "published_configs"
PUBLISHED = {
    "qwen3-32b": "Qwen3-32B.config.json",
    "qwen3-32b-fp8": "Qwen3-32B-FP8.config.json",
    "deepseek-r1": "DeepSeek-R1.config.json",
}


def test_kv_bytes_per_token_match_the_published_architectures():
    assert resolve_model("deepseek-r1").kv_bytes_per_token("bfloat16") == 61 * 576 * 2 == 70_272
    assert resolve_model("qwen3-coder").kv_bytes_per_token("bfloat16") == 62 * 2 * 8 * 128 * 2 == 253_952
    assert resolve_model("qwen3-32b").kv_bytes_per_token("bfloat16") == 64 * 2 * 8 * 128 * 2 == 262_144


@pytest.mark.parametrize("name, file", sorted(PUBLISHED.items()))
def test_catalog_entries_are_the_published_config_json(name, file):
    published = json.loads((PUBLISHED_CONFIGS / file).read_text())
    entry = catalog_config(name)
    # every fact the catalog states is the published file's, and the architecture derived from either is one
    assert entry == {key: published[key] for key in entry}
    assert resolve_model(name) == attrs.evolve(arch_from_hf_config(published, name=name), name=name)


def test_qwen3_32b_is_dense_gqa_and_its_fp8_checkpoint_is_block_fp8():
    arch = resolve_model("qwen3-32b")
    assert (arch.family, arch.attention, arch.is_moe) == ("qwen3", "gqa", False)
    assert (arch.num_layers, arch.hidden_size, arch.num_attention_heads, arch.num_kv_heads, arch.head_dim,
            arch.intermediate_size, arch.vocab_size) == (64, 5120, 64, 8, 128, 25600, 151936)
    assert block_fp8_of(catalog_config("qwen3-32b"), "qwen3-32b") is None
    fp8 = block_fp8_of(catalog_config("qwen3-32b-fp8"), "qwen3-32b-fp8")
    assert fp8 is not None and (fp8.block_rows, fp8.block_cols) == (128, 128)
    assert resolve_model("qwen3-32b-fp8") == attrs.evolve(arch, name="qwen3-32b-fp8")


def test_per_rank_kv_bytes_split_gqa_and_replicate_mla():
    qwen = resolve_model("qwen3-coder")
    assert qwen.kv_bytes_per_token_rank(8) == qwen.kv_bytes_per_token() // 8
    assert qwen.kv_bytes_per_token_rank(16) == qwen.kv_bytes_per_token() // 8  # replicated beyond 8
    r1 = resolve_model("deepseek-r1")
    assert r1.kv_bytes_per_token_rank(8) == r1.kv_bytes_per_token()


@pytest.mark.parametrize("real, tiny", sorted(TINY_VARIANT.items()))
def test_tiny_variants_keep_the_attention_kind_and_8_way_tp(real, tiny):
    r, t = resolve_model(real), resolve_model(tiny)
    assert (t.attention, t.family, t.is_moe) == (r.attention, r.family, r.is_moe)
    assert t.num_attention_heads % 8 == 0
    assert t.attention == "mla" or 8 % t.num_kv_heads == 0 or t.num_kv_heads % 8 == 0


def test_catalog_lists_real_and_tiny_models():
    assert set(catalog_names()) == {"deepseek-r1", "qwen3-coder", "qwen3-coder-fp8", "qwen3-32b", "qwen3-32b-fp8",
                                    "deepseek-r1-tiny", "qwen3-coder-tiny", "qwen3-tiny"}


def test_reads_a_checkpoint_directory(tmp_path):
    config = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
              "vocab_size": 100, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "intermediate_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    arch = resolve_model(str(tmp_path))
    assert (arch.family, arch.num_kv_heads, arch.kv_bytes_per_token("float32")) == ("qwen3", 2, 2 * 2 * 2 * 16 * 4)


def test_bad_checkpoint_directories_name_the_problem(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(ModelError, match="config.json is missing"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ModelError, match="unsupported architecture 'LlamaForCausalLM' in config.json field 'architectures'"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    with pytest.raises(ModelError, match="config.json lacks field 'num_attention_heads'"):
        resolve_model(str(tmp_path))
