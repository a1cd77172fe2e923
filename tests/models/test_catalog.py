"""Model facts: real numbers from the published configs, tiny variants, config.json reading."""

import json

import pytest

from disaggsdk.errors import ModelError
from disaggsdk.models import TINY_VARIANT, catalog_names, resolve_model


def test_kv_bytes_per_token_match_the_published_architectures():
    assert resolve_model("deepseek-r1").kv_bytes_per_token("bfloat16") == 61 * 576 * 2 == 70_272
    assert resolve_model("qwen3-coder").kv_bytes_per_token("bfloat16") == 62 * 2 * 8 * 128 * 2 == 253_952


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
    assert set(catalog_names()) == {"deepseek-r1", "qwen3-coder", "qwen3-coder-fp8", "deepseek-r1-tiny",
                                    "qwen3-coder-tiny", "qwen3-tiny"}


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
