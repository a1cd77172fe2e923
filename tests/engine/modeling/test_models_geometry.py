"""kv_geometry: the per-rank KV shape the runtime sizes its pool from (no torch needed)."""

import subprocess
import sys

import pytest

from disaggsdk.engine.modeling import kv_geometry
from disaggsdk.engine.parallel import TensorParallel
from disaggsdk.errors import ModelError
from disaggsdk.models import resolve_model


def test_gqa_heads_split_then_replicate():
    arch = resolve_model("qwen3-coder")  # 96 query heads, 8 KV heads of 128
    g = kv_geometry(arch, TensorParallel(rank=1, size=4))
    assert (g.attention, g.num_layers, g.num_kv_heads_local, g.head_dim, g.num_q_heads_local) == ("gqa", 62, 2, 128, 24)
    assert g.values_per_token_layer == 2 * 2 * 128
    g16 = kv_geometry(arch, TensorParallel(rank=15, size=16))
    assert (g16.num_kv_heads_local, g16.num_q_heads_local) == (1, 6)
    # the whole instance stores each head once per replica set
    assert sum(kv_geometry(arch, TensorParallel(r, 4)).values_per_token_layer for r in range(4)) == \
        arch.kv_values_per_token_layer


def test_mla_latent_is_replicated():
    arch = resolve_model("deepseek-r1")
    for rank in (0, 7):
        g = kv_geometry(arch, TensorParallel(rank=rank, size=8))
        assert (g.attention, g.num_layers, g.latent_dim, g.kv_lora_rank, g.qk_rope_head_dim) == ("mla", 61, 576, 512, 64)
        assert (g.num_q_heads_local, g.head_dim, g.values_per_token_layer) == (16, 192, 576)


def test_indivisible_tp_is_refused_with_the_field():
    with pytest.raises(ModelError, match="num_key_value_heads=8"):
        kv_geometry(resolve_model("qwen3-coder"), TensorParallel(rank=0, size=12))


def test_geometry_and_registry_import_no_torch():
    code = (
        "import sys\n"
        "from disaggsdk.engine.modeling import kv_geometry, MODEL_CLASSES\n"
        "from disaggsdk.engine.parallel import TensorParallel\n"
        "from disaggsdk.models import resolve_model\n"
        "kv_geometry(resolve_model('qwen3-coder-tiny'), TensorParallel())\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
