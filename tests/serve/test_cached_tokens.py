"""Prefix caching as a client and Prometheus see it: ``usage.prompt_tokens_details.cached_tokens``
(0 on a first prompt, the cached pages' tokens when it comes again; whole, streamed, chat, each
prompt once with ``n`` and batches) and vLLM's prefix cache counters on /metrics."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from disaggsdk.records.instance_stats import InstanceStats
from disaggsdk.records.unit_counters import UnitCounters
from disaggsdk.serve.metrics import ServerMetrics
from tests.serve.promlint import lint

PAGE_SIZE = 16  # EngineConfig's default, which the served engine keeps
PROMPT = [3 + (7 * i) % 200 for i in range(70)]  # 4 full pages before its last token: 64 tokens cacheable


def complete(url: str, **body) -> dict:
    r = httpx.post(f"{url}/v1/completions", json={"max_tokens": 2, "temperature": 0, "ignore_eos": True} | body,
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def streamed_usage(url: str, path: str, body: dict) -> dict:
    body = body | {"stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/{path}", json=body, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["choices"] == []
    return chunks[-1]["usage"]


def counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    assert lint(text) == []
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in ("disaggsdk_prefix_cache_queries_total", "disaggsdk_prefix_cache_hits_total"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_a_repeated_prompt_reports_its_cached_tokens_whole_and_streamed(deployment):
    url = deployment.url
    before = counters(url)
    first = complete(url, prompt=PROMPT)["usage"]
    assert first["prompt_tokens"] == len(PROMPT) and first["prompt_tokens_details"] == {"cached_tokens": 0}
    second = complete(url, prompt=PROMPT)["usage"]
    assert second["prompt_tokens_details"]["cached_tokens"] == 4 * PAGE_SIZE
    assert second["total_tokens"] == second["prompt_tokens"] + second["completion_tokens"]
    streamed = streamed_usage(url, "completions", {"prompt": PROMPT, "max_tokens": 2, "ignore_eos": True})
    assert streamed["prompt_tokens_details"] == {"cached_tokens": 4 * PAGE_SIZE}
    after = counters(url)
    # vLLM's counters, in tokens: three lookups of the whole prompt, two of them found 4 pages
    assert after["disaggsdk_prefix_cache_queries_total"] - before["disaggsdk_prefix_cache_queries_total"] == 3 * 70
    assert after["disaggsdk_prefix_cache_hits_total"] - before["disaggsdk_prefix_cache_hits_total"] == 8 * PAGE_SIZE


def test_each_prompt_counts_once_with_n_and_batches(deployment):
    url = deployment.url
    complete(url, prompt=PROMPT)  # cached from here on, whatever ran before
    n = complete(url, prompt=PROMPT, n=3, temperature=1.0, seed=1)["usage"]
    assert n["prompt_tokens"] == 70 and n["prompt_tokens_details"]["cached_tokens"] == 4 * PAGE_SIZE
    batch = complete(url, prompt=[PROMPT, PROMPT[:10]])["usage"]
    assert batch["prompt_tokens"] == 80 and batch["prompt_tokens_details"]["cached_tokens"] == 4 * PAGE_SIZE


def test_chat_completions_report_cached_tokens(deployment):
    url = deployment.url
    body = {"messages": [{"role": "user", "content": "Tell me about page tables. " * 8}], "max_tokens": 2,
            "temperature": 0, "ignore_eos": True}
    first = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()["usage"]
    assert first["prompt_tokens"] > 2 * PAGE_SIZE and first["prompt_tokens_details"] == {"cached_tokens": 0}
    again = streamed_usage(url, "chat/completions", body)
    cacheable = (again["prompt_tokens"] - 1) // PAGE_SIZE * PAGE_SIZE
    assert again["prompt_tokens_details"] == {"cached_tokens": cacheable}


def test_prefix_cache_and_not_sent_counters_per_engine_pass_the_lint():
    stats = [InstanceStats("prefill-0", "prefill", counters=UnitCounters(prefix_cache_queries=300, prefix_cache_hits=96)),
             InstanceStats("decode-0", "decode", counters=UnitCounters(
                 prefix_cache_queries=300, prefix_cache_hits=160, pages_not_sent=40, bytes_not_sent=163840,
                 requests_fully_cached=2, requests_prefilled_short=5))]
    text = ServerMetrics(lambda wait_s=0.0: stats, "m").exposition().decode()
    assert lint(text) == []
    totals = {(s.name, s.labels["engine"]): s.value for f in text_string_to_metric_families(text)
              for s in f.samples if s.name.endswith("_total")}
    assert totals[("disaggsdk_prefix_cache_queries_total", "decode-0")] == 300
    assert totals[("disaggsdk_prefix_cache_hits_total", "prefill-0")] == 96
    assert totals[("disaggsdk_kv_not_sent_pages_total", "decode-0")] == 40
    assert totals[("disaggsdk_kv_not_sent_bytes_total", "decode-0")] == 163840
    assert totals[("disaggsdk_requests_fully_cached_total", "decode-0")] == 2
    assert totals[("disaggsdk_requests_fully_cached_total", "prefill-0")] == 0
    assert totals[("disaggsdk_requests_prefilled_short_total", "decode-0")] == 5


@pytest.mark.parametrize("queries, hits, rate", [(0, 0, None), (200, 50, 0.25)])
def test_hit_rate(queries, hits, rate):
    stats = InstanceStats("e", "mixed", counters=UnitCounters(prefix_cache_queries=queries, prefix_cache_hits=hits))
    assert stats.counters.prefix_cache_hit_rate == rate


def test_live_views_show_each_engines_hit_rate():
    from rich.console import Console

    from disaggsdk.report.dashboard import rows_html
    from disaggsdk.report.live import instance_rows
    from disaggsdk.report.live_table import instance_table

    stats = [InstanceStats("prefill-0", "prefill"),
             InstanceStats("decode-0", "decode", counters=UnitCounters(prefix_cache_queries=200, prefix_cache_hits=50))]
    rows = instance_rows([], stats, now_s=1.0)
    assert [r.prefix_cache_hit_rate for r in rows] == [None, 0.25]
    console = Console(record=True, width=80)
    console.print(instance_table(rows))
    assert "prefix cache hits (prompt tokens found cached): decode-0 25%" in " ".join(console.export_text().split())
    assert "<th>prefix cache hits</th>" in rows_html(rows) and "<td>25%</td>" in rows_html(rows)


def test_reset_prefix_cache_forgets_what_was_cached(deployment):
    """vLLM's POST /reset_prefix_cache: every page nobody holds is free again and a repeated prompt
    is computed whole; a GET is refused with an OpenAI error object."""
    url = deployment.url
    complete(url, prompt=PROMPT)
    assert complete(url, prompt=PROMPT)["usage"]["prompt_tokens_details"]["cached_tokens"] == 4 * PAGE_SIZE
    r = httpx.post(f"{url}/reset_prefix_cache", timeout=30)
    assert r.status_code == 200 and r.json() == {"reset": True, "num_free_pages": {"mixed-0": 256}}
    assert complete(url, prompt=PROMPT)["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    wrong = httpx.get(f"{url}/reset_prefix_cache", timeout=30)
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == 405
