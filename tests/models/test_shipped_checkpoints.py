"""The trained tiny checkpoints that ship in the package: present, the catalog's architecture, trained
(held-out bits per byte, an MTP layer that agrees with its model), exact against transformers, and
what a catalog name gives the engine, the tokenizer and `disaggsdk generate`."""

from __future__ import annotations

import json

import attrs
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from disaggsdk.cli.main import main as cli_main  # noqa: E402
from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.modeling import build_model  # noqa: E402
from disaggsdk.engine.parallel import TensorParallel  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.engine.tokenizer import HFTokenizer, load_tokenizer  # noqa: E402
from disaggsdk.models import resolve_model  # noqa: E402
from disaggsdk.models.shipped import shipped_checkpoint  # noqa: E402
from tests.launch._helpers import TOP, check_against_hf, hf_greedy  # noqa: E402

NAMES = ["qwen3-tiny", "qwen3-coder-tiny", "deepseek-r1-tiny"]
FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
         "corpus_manifest.json", "loss.jsonl", "train_summary.json"]
CODE_PROMPTS = ["def fib(n):", "class Stack:\n    def __init__(self):", "import os\nimport sys\n\n",
                "for i in range(10):\n    if i % 2", "    return self._", "# Copyright", "x = [1, 2, 3]\n",
                "with open(path) as f:\n"]
MAX_TOKENS = 12


@pytest.mark.parametrize("name", NAMES)
def test_each_tiny_model_ships_trained_with_the_catalog_architecture_and_its_tokenizer(name):
    directory = shipped_checkpoint(name)
    assert directory is not None, f"{name}: no trained checkpoint in the package"
    assert all((directory / f).is_file() for f in FILES)
    from_catalog, from_checkpoint = resolve_model(name), resolve_model(str(directory))
    ignore = {"name", "hf_config"}
    assert {k: v for k, v in attrs.asdict(from_catalog).items() if k not in ignore} == {
        k: v for k, v in attrs.asdict(from_checkpoint).items() if k not in ignore}
    summary = json.loads((directory / "train_summary.json").read_text())
    assert summary["held_out_bits_per_byte"] <= 1.8  # random weights give ~8
    log = [json.loads(line) for line in (directory / "loss.jsonl").read_text().splitlines()]
    assert len(log) == summary["steps"] and log[-1]["loss"] < log[0]["loss"] / 2
    tok = load_tokenizer(name)
    assert isinstance(tok, HFTokenizer) and tok.eos_token_ids == (2, 0)
    assert json.loads((directory / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert from_catalog.vocab_size == 4096 and max(tok.encode("\u00e9\u4e16 def")) < from_catalog.vocab_size


@pytest.mark.parametrize("name", NAMES)
def test_greedy_tokens_equal_transformers_on_the_trained_checkpoint(name):
    directory = shipped_checkpoint(name)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # run to max_new_tokens, as ignore_eos does
    tok = load_tokenizer(name)
    prompts = [tok.encode(p) for p in CODE_PROMPTS]
    ref_tokens, ref_tops = hf_greedy(model, prompts, MAX_TOKENS)
    with LLMEngine(name, EngineConfig(num_pages=64, page_size=8)) as engine:
        outs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP))
    got_tops = [[[t for t, _ in lp.top] for lp in o.new_logprobs] for o in outs]
    check_against_hf(ref_tokens, ref_tops, [o.output_ids for o in outs], got_tops)


def test_a_catalog_name_loads_the_trained_weights_and_dummy_gives_random_ones():
    from safetensors.torch import load_file

    directory = shipped_checkpoint("deepseek-r1-tiny")
    tensors = load_file(str(directory / "model.safetensors"))
    trained = build_model("deepseek-r1-tiny", TensorParallel())
    assert torch.equal(trained.lm_head.weight, tensors["lm_head.weight"].float())
    assert trained.mtp is not None  # the MTP layer ships (layer num_hidden_layers of the checkpoint)
    mtp_weights = dict(trained.mtp[0].named_parameters())
    assert torch.equal(mtp_weights["eh_proj.weight"], tensors["model.layers.4.eh_proj.weight"].float())
    dummy = build_model("deepseek-r1-tiny", TensorParallel(), load_format="dummy")
    assert not torch.equal(dummy.lm_head.weight, trained.lm_head.weight)


def test_the_mtp_layer_agrees_with_its_model_on_held_out_text():
    from safetensors.torch import load_file

    from disaggsdk.bench import code_corpus as corpus
    from tools.train_tiny.eval import mtp_agreement
    from tools.train_tiny.mtp import load_mtp
    from tools.train_tiny.train import token_stream

    directory = shipped_checkpoint("deepseek-r1-tiny")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    mtp = load_mtp(model, load_file(str(directory / "model.safetensors"))).eval()
    from tokenizers import Tokenizer

    held_out = [f for f in corpus.list_files() if f.held_out][:10]
    stream = token_stream(Tokenizer.from_file(str(directory / "tokenizer.json")), held_out, held_out=True)[:1025]
    got = mtp_agreement(model, mtp, stream, 256)
    assert got["mtp_positions"] == 4 * 255 and got["mtp_top1_agreement"] >= 0.5


def test_generate_writes_python_for_a_python_prompt(capsys):
    argv = ["generate", "--model", "qwen3-tiny", "--prompt", "def fib(n):", "--max-tokens", "24", "--json"]
    assert cli_main(argv) == 0
    text = json.loads(capsys.readouterr().out)["outputs"][0]["text"]
    assert text.startswith("\n    "), text  # the body of a function: a new line, indented
