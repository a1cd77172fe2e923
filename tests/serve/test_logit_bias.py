"""``logit_bias`` keys: token ids in ASCII decimal digits, inside the vocabulary; every other key is a
400 naming it, never a 500 and never another token (issue 55: "²" and a 5,000-digit key were 500s
with a traceback, "٣" and "１２" were read as tokens 3 and 12)."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disaggsdk.serve.http.error_bodies import BadRequestError
from disaggsdk.serve.http.openai_request import parse_request

VOCAB_SIZE = 4096  # qwen3-coder-tiny's, the served model of tests/serve/conftest.py
# what str.isdigit / int() take that is no ASCII token id: superscripts, Arabic-Indic and fullwidth
# digits, signs, spaces, underscores, a number int() refuses to read
NOT_TOKEN_IDS = ["²", "⁵", "٣", "１２", "7" * 5000, "-1", "+3", " 3", "3 ", "3_0", "0x1f", "1e3", "", "3.0",
                 "99999999999"]


def encode(text: str) -> list[int]:
    return [1] + [ord(c) % 200 + 2 for c in text]


@pytest.mark.parametrize("key", NOT_TOKEN_IDS)
def test_a_key_that_is_not_ascii_decimal_is_a_400_naming_it(key):
    with pytest.raises(BadRequestError) as refused:
        parse_request({"prompt": "x", "logit_bias": {key: 1}}, False, encode)
    assert refused.value.param == "logit_bias" and refused.value.status == 400
    assert "is not a token id" in str(refused.value) and len(str(refused.value)) < 300


def test_ascii_decimal_keys_are_token_ids_and_one_token_is_given_once():
    req = parse_request({"prompt": "x", "logit_bias": {"12": 5, "3": -1.5, "0": 0}}, False, encode)
    assert req.params.logit_bias == ((0, 0.0), (3, -1.5), (12, 5.0))
    with pytest.raises(BadRequestError, match="both name token 7"):
        parse_request({"prompt": "x", "logit_bias": {"7": 1, "007": 2}}, False, encode)


@pytest.mark.parametrize("key", ["²", "⁵", "٣", "１２", "7" * 5000, "4096"])
def test_the_server_answers_such_keys_with_a_400_error_object(deployment, key):
    r = httpx.post(f"{deployment.url}/v1/completions", json={"prompt": [5, 6], "max_tokens": 1, "logit_bias": {key: 1}})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "logit_bias" and error["type"] == "invalid_request_error" and error["code"] == 400


# the class, run again: random keys (any unicode, numbers in every script, huge ones) over HTTP

KEYS = (st.integers(min_value=0, max_value=VOCAB_SIZE - 1).map(str) | st.text(max_size=12)
        | st.integers(min_value=0, max_value=10**12).map(str)
        | st.text(alphabet=st.characters(categories=["Nd", "No"]), min_size=1, max_size=6)
        | st.integers(min_value=10**20, max_value=10**200).map(str))


def is_token_id(key: str) -> bool:
    return key.isascii() and key.isdigit() and int(key) < VOCAB_SIZE


def test_random_keys_give_200_only_for_ascii_decimal_ids_in_the_vocabulary(deployment):
    statuses: list[int] = []
    with httpx.Client(base_url=deployment.url, timeout=60) as client:

        @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(st.dictionaries(KEYS, st.integers(min_value=-100, max_value=100), min_size=1, max_size=3))
        def fuzz(bias):
            r = client.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 1, "logit_bias": bias})
            ids = [int(k) for k in bias if is_token_id(k)]
            ok = all(is_token_id(k) for k in bias) and len(set(ids)) == len(ids)
            assert r.status_code == (200 if ok else 400), (bias, r.status_code, r.text)
            statuses.append(r.status_code)
            if not ok:
                assert r.json()["error"]["param"] == "logit_bias"

        fuzz()
    assert statuses.count(200) >= 10 and statuses.count(400) >= 10  # both sides of the line were tried
