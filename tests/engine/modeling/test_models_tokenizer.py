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


@pytest.mark.parametrize("model", ["qwen3-coder-tiny", "deepseek-r1-tiny"])
def test_min_tokens_never_exceeds_the_tokens_encode_gives(model):
    # the server refuses a prompt when this bound passes the context: a bound above the truth would
    # refuse a prompt that fits; random text of every kind the tokenizer meets
    from hypothesis import given, settings
    from hypothesis import strategies as st

    tok = load_tokenizer(model)
    assert isinstance(tok, HFTokenizer)
    specials = st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "\n\n", "    ", "def ", "é", "世界", "🙂"])
    pieces = st.one_of(st.text(max_size=40), specials)

    @settings(max_examples=300, deadline=None)
    @given(st.lists(pieces, max_size=30).map("".join))
    def bound_holds(text: str) -> None:
        assert tok.min_tokens(text) <= len(tok.encode(text))

    bound_holds()
    assert tok.min_tokens("a " * 400_000) > 4096  # and it is a bound that refuses 800 kB at once


def test_no_bound_where_one_token_may_stand_for_any_run_of_text(tmp_path):
    # a normalizer may shorten the text first; WordPiece reads an unknown word as one token
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    normalized = Tokenizer(models.BPE({"a": 0, "b": 1}, merges=[]))
    normalized.normalizer = normalizers.NFKC()
    for i, t in enumerate((wordpiece, normalized)):
        directory = tmp_path / str(i)
        directory.mkdir()
        t.save(str(directory / "tokenizer.json"))
        (directory / "config.json").write_text(json.dumps({"vocab_size": 2}))
        tok = load_tokenizer(str(directory))
        assert isinstance(tok, HFTokenizer)
        assert tok.min_tokens("x" * 10_000) == 0
    assert len(load_tokenizer(str(tmp_path / "0")).encode("x" * 10_000)) == 1  # why: one [UNK] for it all


def test_encode_lets_other_threads_run_while_it_tokenizes():
    # a server tokenizes a prompt on a worker thread while its event loop streams other clients'
    # tokens and a thread reads the units' heartbeats: encoding must not hold the GIL for seconds
    import threading

    tok = load_tokenizer("qwen3-coder-tiny")
    text = "x1 y2 " * 300_000  # ~1.8 MB, about a second of tokenizing
    ticks, stop = [0], threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks[0] += 1
            stop.wait(0.005)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        before = ticks[0]
        n = len(tok.encode(text))
        during = ticks[0] - before
    finally:
        stop.set()
        ticker.join()
    assert n > 500_000
    # a call that holds the GIL lets the ticker run at most as it enters and leaves (a tick or two);
    # one that lets go ticks every 5 ms for as long as it runs
    assert during >= 20, f"the ticker ran {during} times while encode ran: encode holds the GIL"
