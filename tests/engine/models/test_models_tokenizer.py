"""Tokenizers: the tiny catalog models' shipped BPE, a directory's tokenizer.json, the byte-level one."""

import json

import pytest

from disaggsdk.engine.tokenizer import BYTE_BOS, BYTE_EOS, ByteTokenizer, HFTokenizer, load_tokenizer
from disaggsdk.errors import ModelError
from disaggsdk.models import catalog_config


def test_byte_tokenizer_round_trips_utf8_and_marks_specials():
    tok = ByteTokenizer()
    text = "héllo, 世界!"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.encode(text, add_bos=True) == [BYTE_BOS, *ids]
    assert tok.decode([BYTE_BOS, *ids, BYTE_EOS]) == text
    assert tok.decode([BYTE_BOS, 104, 105, BYTE_EOS], skip_special_tokens=False) == "<bos>hi<eos>"
    assert tok.decode([0xE4, 0xB8]) == "\ufffd"  # a cut UTF-8 sequence does not raise
    assert tok.eos_token_ids == (BYTE_EOS,)


def test_catalog_ids_agree_with_the_shipped_tokenizer():
    config = catalog_config("qwen3-coder-tiny")
    tok = load_tokenizer("qwen3-coder-tiny")
    assert isinstance(tok, HFTokenizer)
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (None, 2, 0)
    assert tok.bos_token_id is None and tok.eos_token_ids == (2, 0)  # <|im_end|>, <|endoftext|>
    assert tok.decode(tok.encode("<|im_start|>user\nhi<|im_end|>"), skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"
    assert max(tok.encode("def fib(n):\n    return n")) < config["vocab_size"]


def test_load_tokenizer_for_names_and_directories(tmp_path):
    assert load_tokenizer("deepseek-r1") is None
    byte_level = {**catalog_config("qwen3-tiny"), "bos_token_id": BYTE_BOS, "eos_token_id": BYTE_EOS}
    (tmp_path / "config.json").write_text(json.dumps(byte_level))
    assert isinstance(load_tokenizer(str(tmp_path)), ByteTokenizer)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**byte_level, "bos_token_id": 1}))
    assert load_tokenizer(str(other)) is None
    with pytest.raises(ModelError, match="does not exist"):
        load_tokenizer(str(tmp_path / "missing"))


def test_directory_tokenizer_json_is_used_with_generation_config_eos(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<s>": 0, "</s>": 1, "hello": 2, "world": 3, "[UNK]": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({**catalog_config("qwen3-tiny"), "eos_token_id": 1}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": [1, 3]}))
    loaded = load_tokenizer(str(tmp_path))
    assert isinstance(loaded, HFTokenizer)
    assert loaded.encode("hello world") == [2, 3]
    assert loaded.encode("hello", add_bos=True) == [0, 2]
    assert loaded.decode([0, 2, 3, 1]) == "hello world"
    assert loaded.eos_token_ids == (1, 3)


def test_unreadable_tokenizer_json_names_the_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    (tmp_path / "config.json").write_text(json.dumps(catalog_config("qwen3-tiny")))
    with pytest.raises(ModelError, match="tokenizer.json"):
        load_tokenizer(str(tmp_path))
