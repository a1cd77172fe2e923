"""A client's ``X-Request-Id`` names its answer but never keys the request inside the server: a second
request with the id of one in flight is refused (400) and the first one finishes untouched."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from disaggsdk.serve.http.client_request_ids import ClientRequestIds
from disaggsdk.serve.http.error_bodies import BadRequestError

NUM_TOKENS = 300


def stream_while_a_duplicate_comes(url: str, request_id: str) -> tuple[httpx.Response, list[dict]]:
    """Stream a long request with ``request_id``; after its first chunk, post another with the same
    id. Returns the duplicate's response and the first request's SSE chunks."""
    body = {"prompt": [5, 6, 7, 8], "max_tokens": NUM_TOKENS, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.0}
    headers = {"X-Request-Id": request_id}
    chunks, duplicate = [], None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200 and r.headers["x-request-id"] == request_id
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks.append(json.loads(line[len("data: "):]))
            if duplicate is None:
                assert not chunks[-1]["choices"][0]["finish_reason"], "too fast to be in flight: raise NUM_TOKENS"
                short = {k: v for k, v in body.items() if k != "stream_options"} | {"stream": False, "max_tokens": 2}
                duplicate = httpx.post(f"{url}/v1/completions", json=short, headers=headers, timeout=60)
    return duplicate, chunks


def check_untouched(duplicate: httpx.Response, chunks: list[dict], request_id: str) -> None:
    assert duplicate.status_code == 400, duplicate.text
    error = duplicate.json()["error"]
    assert request_id in error["message"] and error["param"] == "X-Request-Id" and error["code"] == 400
    assert all(c["id"] == f"cmpl-{request_id}" for c in chunks)
    with_choices = [c for c in chunks if c["choices"]]
    assert with_choices[-1]["choices"][0]["finish_reason"] == "length", with_choices[-1]
    assert chunks[-1]["usage"]["completion_tokens"] == NUM_TOKENS  # all its tokens, none cut by an abort


def test_a_duplicate_in_flight_id_is_refused_and_the_first_request_finishes(deployment):
    duplicate, chunks = stream_while_a_duplicate_comes(deployment.url, "shared-id")
    check_untouched(duplicate, chunks, "shared-id")
    again = httpx.post(f"{deployment.url}/v1/completions", headers={"X-Request-Id": "shared-id"}, timeout=60,
                       json={"prompt": [5, 6], "max_tokens": 2})
    assert again.status_code == 200 and again.headers["x-request-id"] == "shared-id"  # free once it ended


def test_a_client_that_leaves_mid_stream_frees_its_id(deployment):
    body = {"prompt": [5, 6, 7, 8], "max_tokens": NUM_TOKENS, "ignore_eos": True, "stream": True}
    headers = {"X-Request-Id": "gone-id"}
    with httpx.stream("POST", f"{deployment.url}/v1/completions", json=body, headers=headers, timeout=60) as r:
        next(r.iter_lines())  # one chunk, then hang up
    deadline = time.monotonic() + 10
    while True:  # the server learns of the hang-up at its next chunk
        again = httpx.post(f"{deployment.url}/v1/completions", json={"prompt": [5], "max_tokens": 1},
                           headers=headers, timeout=60)
        if again.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert again.status_code == 200, again.text


def test_the_same_id_in_two_clients_never_aborts_a_launched_deployments_request():
    pytest.importorskip("torch")
    from disaggsdk.face.deployment import launch
    from tests.launch._helpers import make_spec

    spec = make_spec("qwen3-coder-tiny", num_pages=256, budget=64)
    with launch(spec, port=0, max_restarts=0) as d:
        duplicate, chunks = stream_while_a_duplicate_comes(d.url, "probe-33")
        check_untouched(duplicate, chunks, "probe-33")
        again = httpx.post(f"{d.url}/v1/completions", headers={"X-Request-Id": "probe-33"}, timeout=60,
                           json={"prompt": [5, 6], "max_tokens": 2})
        assert again.status_code == 200  # the id is free again once its request ended


def test_claims_are_refused_while_held_and_free_once_released():
    ids = ClientRequestIds()
    release_a = ids.claim("a")
    with pytest.raises(BadRequestError, match="'a' is in flight"):
        ids.claim("a")
    ids.claim("b")
    ids.claim(None)()  # no id given: nothing to hold or free
    release_a()
    release_a()  # idempotent: a stream's end and its background task may both free it
    ids.claim("a")
    assert ids.num_in_flight == 2
