"""Block-FP8 checkpoints (DeepSeek-V3/R1 and Qwen3-*-FP8 layout): FP8 copies of the shipped tiny models
load at tp 1 and 2 and give the greedy tokens of transformers on the same model dequantized to float32
by this file (plain torch, not the engine's loader); tp shards that cut through a scale block come
out exact; a checkpoint whose FP8 storage disagrees with its format is refused, naming the tensor."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from disaggsdk.engine import fp8_blocks  # noqa: E402
from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.modeling import build_model  # noqa: E402
from disaggsdk.engine.parallel import TensorParallel  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.errors import ModelError  # noqa: E402
from disaggsdk.models.shipped import shipped_checkpoint  # noqa: E402
from tests.launch._helpers import TOP, check_against_hf, hf_greedy  # noqa: E402
from tools.fp8_checkpoint import write_fp8_checkpoint  # noqa: E402

MODELS = ("deepseek-r1-tiny", "qwen3-coder-tiny")
PROMPT_LENGTHS = (1, 4, 9, 16, 23, 30, 37, 50)
MAX_TOKENS = 8


def fp8_copy(name: str, directory, block_size: int = 128):
    write_fp8_checkpoint(shipped_checkpoint(name), directory, block_size)
    return directory


@pytest.fixture(scope="module")
def fp8_dirs(tmp_path_factory):
    """An FP8 copy (128 x 128 blocks, DeepSeek's) of each shipped tiny model."""
    return {name: fp8_copy(name, tmp_path_factory.mktemp(name)) for name in MODELS}


def dequantized_by_hand(directory) -> dict[str, torch.Tensor]:
    """The checkpoint's real weights in float32, dequantized here with plain torch (the reference
    must not share the engine's loader): each scale repeated over its block, ragged edges cropped."""
    config = json.loads((directory / "config.json").read_text())
    block_rows, block_cols = config["quantization_config"]["weight_block_size"]
    tensors = load_file(str(directory / "model.safetensors"))
    out = {}
    for name, tensor in tensors.items():
        if name.endswith("weight_scale_inv"):
            continue
        scale = tensors.get(name + "_scale_inv")
        if scale is None:
            out[name] = tensor.float()
            continue
        assert tensor.dtype == torch.float8_e4m3fn, name
        rows, cols = tensor.shape
        per_element = scale.float().repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)[:rows, :cols]
        out[name] = tensor.float() * per_element
    return out


def reference_model(fp8_dir, tmp_path):
    """transformers' model of the FP8 checkpoint's dequantized weights, in float32."""
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    config = json.loads((fp8_dir / "config.json").read_text())
    del config["quantization_config"]
    (ref_dir / "config.json").write_text(json.dumps({**config, "dtype": "float32"}))
    save_file(dequantized_by_hand(fp8_dir), str(ref_dir / "model.safetensors"), metadata={"format": "pt"})
    return transformers.AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.float32).eval()


def prompts():
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(3, 4000, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


# --- the block math -----------------------------------------------------------------------------


def test_quantize_then_dequantize_is_close_and_ragged_blocks_have_their_own_scale():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(80, 200, generator=gen)
    weight[64:, :] *= 100  # the ragged last row block (16 rows) is much larger: its own scale must hold it
    weight[:64, 128:] = 0  # an all-zero block: scale 1, values 0
    fp8, scale = fp8_blocks.quantize_blocks(weight, (64, 128))
    assert fp8.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (2, 2)
    assert scale[0, 1] == 1.0
    # scale = block amax / 448, so every block's largest value is exactly representable at +-448
    assert torch.allclose(scale[1, 0], weight[64:, :128].abs().max() / 448)
    back = fp8_blocks.dequantize_blocks(fp8, scale, (64, 128))
    assert torch.equal(back[:64, 128:], torch.zeros(64, 72))
    # e4m3 keeps 3 mantissa bits: every value within 1/16 of itself, relative to its block's scale
    per_element = scale.repeat_interleave(64, 0).repeat_interleave(128, 1)[:80, :200]
    assert ((back - weight).abs() <= per_element * 448 / 16 + 1e-6).all()
    with pytest.raises(ModelError, match=r"needs a scale of shape \[2, 2\], got \[2, 1\]"):
        fp8_blocks.dequantize_blocks(fp8, scale[:, :1], (64, 128))


@pytest.mark.parametrize("shard_dim", [0, 1])
def test_a_slice_that_cuts_through_blocks_equals_those_rows_of_the_whole_tensor(tmp_path, shard_dim):
    gen = torch.Generator().manual_seed(1)
    fp8, scale = fp8_blocks.quantize_blocks(torch.randn(80, 100, generator=gen), (32, 32))
    save_file({"w": fp8, "s": scale}, str(tmp_path / "t.safetensors"))
    whole = fp8_blocks.dequantize_blocks(fp8, scale, (32, 32))
    with safe_open(str(tmp_path / "t.safetensors"), framework="pt") as handle:
        weight, scales = handle.get_slice("w"), handle.get_slice("s")
        size = whole.shape[shard_dim]
        for start, stop in [(0, size), (0, 40), (40, size), (7, 33), (32, 64), (63, 65), (size - 3, size)]:
            got = fp8_blocks.read_dequantized(weight, scales, (32, 32), shard_dim, (start, stop))
            want = whole[start:stop] if shard_dim == 0 else whole[:, start:stop]
            assert torch.equal(got, want), (start, stop)


# --- loading the FP8 copies of the shipped models -------------------------------------------------


@pytest.mark.parametrize("block_size", [128, 48])
@pytest.mark.parametrize("name", MODELS)
def test_tp2_shards_are_the_rows_of_the_tp1_tensors_even_through_a_block(tmp_path, name, block_size):
    # 128: the experts' 128-wide intermediate dimension splits into 64 + 64 inside one block;
    # 48: almost every split (256 = 5 x 48 + 16, 512 / 2 = 256) starts or stops inside a block
    directory = fp8_copy(name, tmp_path / "fp8", block_size)
    whole = {s.name: s for s in build_model(str(directory), TensorParallel()).weight_slots()}
    cut_through = 0
    for rank in range(2):
        for slot in build_model(str(directory), TensorParallel(rank=rank, size=2)).weight_slots():
            full = whole[slot.name].target
            if slot.shard_dim is None:
                assert torch.equal(slot.target, full), slot.name
                continue
            start, stop = slot.shard
            want = full[start:stop] if slot.shard_dim == 0 else full[:, start:stop]
            assert torch.equal(slot.target, want), slot.name
            cut_through += start % block_size != 0 or (stop % block_size != 0 and stop != slot.full_shape[slot.shard_dim])
    assert cut_through > 0  # the case this test is about did occur


@pytest.mark.parametrize("name", MODELS)
def test_fp8_copy_loads_the_dequantized_weights_in_bfloat16_too(fp8_dirs, name):
    reference = dequantized_by_hand(fp8_dirs[name])
    model = build_model(str(fp8_dirs[name]), TensorParallel(), dtype="bfloat16")
    dtypes = set()
    for slot in model.weight_slots():  # DeepSeek's router stays float32 whatever the model dtype
        dtypes.add(slot.target.dtype)
        assert torch.equal(slot.target, reference[slot.name].to(slot.target.dtype)), slot.name
    assert torch.bfloat16 in dtypes


def chosen_logprobs(model, prompts_, outputs) -> list[float]:
    """transformers' logprob of each token the engine chose, from one forward pass per sequence."""
    out = []
    with torch.no_grad():
        for p, tokens in zip(prompts_, outputs):
            logits = model(torch.tensor([p + tokens[:-1]])).logits[0].float().log_softmax(-1)
            out += [logits[len(p) - 1 + j, t].item() for j, t in enumerate(tokens)]
    return out


# tp 1 and tp 2 for both families (about 3 s each)
@pytest.mark.parametrize("name,tp", [("deepseek-r1-tiny", 1), ("deepseek-r1-tiny", 2), ("qwen3-coder-tiny", 1),
                                     ("qwen3-coder-tiny", 2)])
def test_greedy_tokens_equal_transformers_on_the_dequantized_model(fp8_dirs, tmp_path, name, tp):
    directory = fp8_dirs[name]
    ps = prompts()
    reference = reference_model(directory, tmp_path)
    ref_tokens, ref_tops = hf_greedy(reference, ps, MAX_TOKENS)
    config = EngineConfig(tp=tp, page_size=4, num_pages=128, max_num_batched_tokens=64)
    with LLMEngine(str(directory), config) as engine:
        outs = engine.generate(ps, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP))
    got = [o.output_ids for o in outs]
    got_tops = [[[t for t, _ in lp.top] for lp in o.new_logprobs] for o in outs]
    check_against_hf(ref_tokens, ref_tops, got, got_tops)
    # The tiny models are trained: FP8 rounding rarely flips a greedy token, so the tokens alone would
    # not tell the FP8 weights from the bfloat16 ones. The logprobs do: the engine's agree with the
    # dequantized model's to float32 noise, and differ from the bfloat16 original's by far more.
    engine_logprobs = torch.tensor([lp.logprob for o in outs for lp in o.new_logprobs])
    to_fp8 = (engine_logprobs - torch.tensor(chosen_logprobs(reference, ps, got))).abs().max().item()
    original = transformers.AutoModelForCausalLM.from_pretrained(str(shipped_checkpoint(name)), dtype=torch.float32)
    to_bf16 = (engine_logprobs - torch.tensor(chosen_logprobs(original.eval(), ps, got))).abs().max().item()
    assert to_fp8 < 1e-4 and to_bf16 > 100 * to_fp8, (to_fp8, to_bf16)


# --- refusals ------------------------------------------------------------------------------------


def rewrite(directory, edit):
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.fixture
def broken(fp8_dirs, tmp_path):
    """A fresh copy of the FP8 DeepSeek checkpoint, to break."""
    return shutil.copytree(fp8_dirs["deepseek-r1-tiny"], tmp_path / "broken")


KV_A = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"  # [80, 256]: scale [1, 2], a ragged row block


def test_bfloat16_scales_load_as_some_qwen_fp8_releases_store_them(broken):
    def to_bf16(tensors):
        for name in [n for n in tensors if n.endswith("_scale_inv")]:
            tensors[name] = tensors[name].to(torch.bfloat16)

    rewrite(broken, to_bf16)
    reference = dequantized_by_hand(broken)
    for slot in build_model(str(broken), TensorParallel()).weight_slots():
        assert torch.equal(slot.target, reference[slot.name]), slot.name
    rewrite(broken, lambda t: t.__setitem__(KV_A + "_scale_inv", t[KV_A + "_scale_inv"].to(torch.float16)))
    with pytest.raises(ModelError, match=rf"scale tensor '{KV_A}_scale_inv' is stored as F16; scales are F32 or BF16"):
        build_model(str(broken), TensorParallel())


def test_a_missing_scale_tensor_is_named(broken):
    rewrite(broken, lambda t: t.pop(KV_A + "_scale_inv"))
    with pytest.raises(ModelError, match=rf"FP8 tensor '{KV_A}' has no scale tensor '{KV_A}_scale_inv'.*incomplete"):
        build_model(str(broken), TensorParallel())


def test_a_misshaped_scale_tensor_is_named_with_both_shapes(broken):
    rewrite(broken, lambda t: t.__setitem__(KV_A + "_scale_inv", torch.ones(1, 1)))
    with pytest.raises(ModelError) as err:
        build_model(str(broken), TensorParallel())
    msg = str(err.value)
    assert f"scale tensor '{KV_A}_scale_inv' has shape [1, 1]" in msg and "[80, 256] weight" in msg
    assert "128x128 blocks needs [1, 2]" in msg


def test_fp8_storage_that_disagrees_with_the_format_is_refused(broken):
    # the format leaves lm_head unquantized: an FP8 lm_head would load without a scale
    lm_head = "lm_head.weight"
    rewrite(broken, lambda t: t.__setitem__(lm_head, t[lm_head].to(torch.float8_e4m3fn)))
    with pytest.raises(ModelError, match=rf"'{lm_head}' is stored as F8_E4M3 but .* does not quantize it"):
        build_model(str(broken), TensorParallel())


def test_an_unquantized_tensor_where_the_format_says_fp8_is_refused(broken):
    rewrite(broken, lambda t: t.__setitem__(KV_A, t[KV_A].float()))
    with pytest.raises(ModelError, match=rf"'{KV_A}' is stored as F32 but .*quantizes it to F8_E4M3"):
        build_model(str(broken), TensorParallel())


def test_a_scale_beside_an_unquantized_tensor_is_refused(broken):
    gate = "model.layers.1.mlp.gate.weight"  # the router: never quantized
    rewrite(broken, lambda t: t.__setitem__(gate + "_scale_inv", torch.ones(1, 2)))
    with pytest.raises(ModelError, match=rf"'{gate}' has a scale tensor '{gate}_scale_inv'"):
        build_model(str(broken), TensorParallel())


def test_fp8_tensors_without_a_quantization_config_are_refused(broken):
    config = json.loads((broken / "config.json").read_text())
    del config["quantization_config"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=r"is stored as F8_E4M3 but config.json has no quantization_config"):
        build_model(str(broken), TensorParallel())


@pytest.mark.parametrize("quant, message", [
    ({"quant_method": "awq"}, r"quant_method is 'awq'; only block-scaled 'fp8'"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, r"weight_block_size is None.*per-tensor fp8 is not"),
    ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}, r"fmt is 'e5m2'"),
])
def test_a_quantization_config_the_engine_cannot_load_is_refused(broken, quant, message):
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
    with pytest.raises(ModelError, match=message):
        build_model(str(broken), TensorParallel())

