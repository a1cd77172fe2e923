"""Streamed text: stop strings across token boundaries, partial UTF-8 held back, nothing resent."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsdk.engine.tokenizer import ByteTokenizer
from disaggsdk.serve.http.text_stream import TextStream

TOK = ByteTokenizer()


def feed(stream: TextStream, ids: list[int], per: int = 1) -> str:
    out = ""
    for i in range(0, len(ids), per):
        out += stream.add(ids[i:i + per], final=i + per >= len(ids))
        if stream.stopped:
            break
    return out


def test_stop_string_split_over_tokens_is_cut_and_not_sent():
    s = TextStream(TOK.decode, stop=["END"])
    assert feed(s, TOK.encode("abc ENDdef")) == "abc "
    assert s.stopped


def test_the_stop_string_is_sent_when_asked():
    s = TextStream(TOK.decode, stop=["END", "de"], include_stop=True)
    assert feed(s, TOK.encode("abc ENDdef")) == "abc END" and s.stopped


def test_partial_utf8_waits_for_its_last_byte():
    s = TextStream(TOK.decode)
    euro = TOK.encode("€")  # three bytes
    assert s.add(euro[:1]) == "" and s.add(euro[1:2]) == ""
    assert s.add(euro[2:]) == "€"


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet="ab€ xy", max_size=30), stop=st.sampled_from(["", "b€", "xx", "a"]), per=st.integers(1, 4))
def test_streamed_text_equals_the_whole_text_up_to_the_first_stop(text, stop, per):
    s = TextStream(TOK.decode, stop=[stop] if stop else [])
    out = feed(s, TOK.encode(text), per)
    expected = text[: text.find(stop)] if stop and stop in text else text
    assert out == expected
    assert s.stopped == bool(stop and stop in text)


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(0, 258), max_size=40), per=st.integers(1, 3))
def test_incremental_decoding_of_any_bytes_equals_decoding_the_whole_output(ids, per):
    s = TextStream(TOK.decode)
    assert feed(s, ids, per) == TOK.decode(ids)
