"""The engine's MTP layer against a torch reference written from the DeepSeek-V3 description
(`tools/train_tiny/mtp.py` over transformers' model: transformers has no MTP forward)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch  # noqa: E402
from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.model_runner import ModelRunner, RunnerConfig  # noqa: E402
from disaggsdk.engine.parallel import TensorParallel  # noqa: E402
from disaggsdk.engine.tokenizer import load_tokenizer  # noqa: E402
from disaggsdk.models.shipped import shipped_checkpoint  # noqa: E402

MODEL = "deepseek-r1-tiny"
TEXT = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"


def test_mtp_logits_over_a_prompt_equal_the_reference():
    from safetensors.torch import load_file

    from tools.train_tiny.mtp import load_mtp

    directory = shipped_checkpoint(MODEL)
    ids = load_tokenizer(MODEL).encode(TEXT)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    ref_mtp = load_mtp(hf, load_file(str(directory / "model.safetensors"))).eval()
    tokens = torch.tensor([ids])
    with torch.no_grad():
        hidden = hf.model(tokens).last_hidden_state
        ref = ref_mtp(hidden[:, :-1], tokens[:, 1:], torch.arange(len(ids) - 1)[None])[0]

    page_size = 4
    runner = ModelRunner(RunnerConfig(MODEL, EngineConfig(num_pages=32, page_size=page_size), extra_kv_layers=1),
                         TensorParallel())
    assert runner.kv_cache.geometry.num_layers == runner.model.arch.num_layers + 1  # the MTP layer's KV
    batch = build_forward_batch([BatchItem(ids, 0, list(range(-(-len(ids) // page_size))))], page_size, "cpu")
    hidden_all, _, _ = runner.run_keeping_hidden(batch)
    torch.testing.assert_close(hidden_all, hidden[0], rtol=1e-4, atol=1e-4)
    mtp = runner.model.mtp[0]
    with torch.inference_mode():  # row i sees h_i and t_{i+1}; the last row has no t_{i+1} (a pad)
        got = mtp.compute_logits(mtp(hidden_all, torch.tensor(ids[1:] + [0]), batch.positions, runner.attn))[:-1]
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
