"""The pieces of the tiny-checkpoint training tool: corpus, tokenizer, chat template."""

from __future__ import annotations

import json

import pytest

from disaggsdk.bench import code_corpus as corpus
from tools.train_tiny.tokenizer import IM_END, SPECIAL_TOKENS, save_tokenizer_files, special_ids, train_tokenizer

pytest.importorskip("tokenizers")


def test_corpus_is_fixed_sorted_checked_and_holds_out_a_slice(tmp_path):
    for rel in ["b.py", "a.py", "pkg/c.py", "tests/t.py", "pkg/test/u.py", "idlelib/x.py", "notes.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"# {rel}\n")
    files = corpus.list_files(tmp_path)
    assert [f.relative_path for f in files] == ["a.py", "b.py", "pkg/c.py"]  # tests, idlelib, non-py out
    assert [f.held_out for f in files] == [True, False, False]  # every 20th from the first
    assert corpus.manifest(files) == corpus.manifest(corpus.list_files(tmp_path))  # deterministic
    assert list(corpus.texts(files, held_out=True, root=tmp_path)) == ["# a.py\n"]
    (tmp_path / "b.py").write_text("changed\n")
    with pytest.raises(ValueError, match="b.py changed"):
        list(corpus.texts(files, held_out=False, root=tmp_path))


def test_the_stdlib_corpus_is_there_offline():
    files = corpus.list_files()
    assert len(files) > 200 and sum(f.size_bytes for f in files) > 2_000_000
    assert 0 < sum(f.held_out for f in files) < len(files) / 10


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    files = corpus.list_files()[:40]
    tok = train_tokenizer(corpus.texts(files, held_out=False), vocab_size=1024)
    out = tmp_path_factory.mktemp("tok")
    save_tokenizer_files(tok, out)
    return tok, out


def test_tokenizer_round_trips_code_and_keeps_special_tokens_whole(tokenizer_dir):
    tok, _ = tokenizer_dir
    assert tok.get_vocab_size() == 1024
    assert list(special_ids(tok).values()) == list(range(len(SPECIAL_TOKENS)))
    code = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # é ✓\n"
    ids = tok.encode(code).ids
    assert tok.decode(ids) == code and len(ids) < 0.7 * len(code.encode())  # merges learnt from code
    chat = f"<|im_start|>user\nhi{IM_END}"
    assert tok.encode(chat).ids[0] == special_ids(tok)["<|im_start|>"]
    assert special_ids(tok)[IM_END] in tok.encode(chat).ids


def test_chat_template_renders_roles_tools_and_tool_calls(tokenizer_dir):
    transformers = pytest.importorskip("transformers")
    _, out = tokenizer_dir
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    assert hf.eos_token == IM_END and json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    tools = [{"type": "function", "function": {"name": "get_time", "description": "Now.",
                                               "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Time in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "get_time", "arguments": {"tz": "CET", "n": 2}}}]},
        {"role": "tool", "content": "12:00"},
        {"role": "assistant", "content": "Noon."},
        {"role": "user", "content": "Thanks"},
    ]
    text = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    tool_json = json.dumps(tools[0]["function"], ensure_ascii=False)
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more of these functions:\n<tools>\n"
        f"{tool_json}\n</tools>\n\nTo call a function, reply with:\n<tool_call>\n<function=name>\n"
        "<parameter=argument>\nvalue\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nTime in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n"
        "<parameter=n>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nNoon.<|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    plain = hf.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False, tokenize=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n"


def test_training_steps_are_deterministic_resumable_and_give_a_checkpoint_transformers_loads(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from tools.train_tiny.train import TrainSettings, train

    tiny = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16)
    small = TrainSettings(seq_len_tokens=32, batch_size=4, warmup_steps=2, max_steps=6, save_every=3,
                          eval_every=6, minutes=5, threads=1)
    straight = train("qwen3-tiny", tmp_path / "a", small, max_files=12, vocab_size=512, **tiny)
    # the same run cut after 3 steps, then started again: picks up the saved state
    train("qwen3-tiny", tmp_path / "b", TrainSettings(**{**small.__dict__, "max_steps": 3}), max_files=12,
          vocab_size=512, **tiny)
    resumed = train("qwen3-tiny", tmp_path / "b", small, max_files=12, vocab_size=512, **tiny)
    assert straight["steps"] == resumed["steps"] == 6 and straight["final_loss"] == resumed["final_loss"]
    losses = [json.loads(line)["loss"] for line in (tmp_path / "a" / "loss.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0]  # it learns
    a = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "a"))
    b = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "b"))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert 0 < straight["held_out_bits_per_byte"] < 16
    assert json.loads((tmp_path / "a" / "corpus_manifest.json").read_text())["sha256"]


def test_deepseek_trains_its_mtp_layer_and_saves_it_where_the_engine_reads_it(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    from disaggsdk.engine.modeling import build_model
    from disaggsdk.engine.parallel import TensorParallel
    from tools.train_tiny.mtp import load_mtp
    from tools.train_tiny.train import TrainSettings, train

    tiny = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_group=2, topk_group=1,
                q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)
    small = TrainSettings(seq_len_tokens=32, batch_size=4, warmup_steps=2, max_steps=8, save_every=8,
                          eval_every=8, minutes=5, threads=1)
    out = tmp_path / "ds"
    train("deepseek-r1-tiny", out, small, max_files=12, vocab_size=512, **tiny)
    log = [json.loads(line) for line in (out / "loss.jsonl").read_text().splitlines()]
    assert log[-1]["mtp_loss"] < log[0]["mtp_loss"]  # the next-next-token head learns too
    tensors = load_file(str(out / "model.safetensors"))
    mtp_names = {k for k in tensors if k.startswith("model.layers.2.")}  # layer num_hidden_layers
    assert {"model.layers.2.eh_proj.weight", "model.layers.2.shared_head.head.weight",
            "model.layers.2.mlp.experts.3.down_proj.weight"} <= mtp_names
    # transformers reads the main model (MTP keys are unexpected to it); load_mtp reads the rest back
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    again = load_mtp(hf, tensors).checkpoint_tensors()
    assert set(again) == mtp_names and all(torch.equal(again[k], tensors[k].float()) for k in mtp_names)
    engine_model = build_model(str(out), TensorParallel())
    assert engine_model.mtp is not None
    assert torch.equal(dict(engine_model.mtp[0].named_parameters())["eh_proj.weight"],
                       tensors["model.layers.2.eh_proj.weight"].float())
