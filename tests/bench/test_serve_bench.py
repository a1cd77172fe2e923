"""The benchmark against a live server: vLLM field names, sane values; datasets; SLO parsing; CLI.

Chunk timing (one ITL per chunk, vLLM's TPOT) and the result keys were checked against vLLM 0.32's
own request functions on a scripted SSE stream; the pure tests below pin the same numbers.
"""

from __future__ import annotations

import json
import math

import pytest

from disaggsdk.bench.dataset import DatasetError, random_requests, sharegpt_requests
from disaggsdk.bench.serve_bench import BenchError, LoadShape, bench, parse_goodput, parse_slos
from disaggsdk.bench.serve_request import RequestOptions

# the keys of vLLM 0.32's `bench serve` result (vllm/benchmarks/serve.py), audio and pooling ones aside
VLLM_FIELDS = [
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput", "input_lens",
    "output_lens", "ttfts", "itls", "latencies", "start_times", "generated_texts", "errors",
    "max_output_tokens_per_s", "max_concurrent_requests",
    *(f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "std", "p99")),
]


@pytest.fixture(scope="module")
def server():
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.face.deployment import serve_model

    with serve_model("qwen3-coder-tiny", EngineConfig(num_pages=256), port=0, api_key="k") as d:
        yield d


def test_bench_against_a_live_server_has_vllm_fields_and_sane_values(server):
    requests = random_requests(12, input_len=64, output_len=8, range_ratio=0.5, seed=1)
    done = []
    r = bench(server.url, requests, LoadShape(qps=30, seed=1), api_key="k", slos_ms={"ttft": 60_000},
              on_done=done.append)
    assert not [f for f in VLLM_FIELDS if f not in r]
    assert r["completed"] == 12 and r["failed"] == 0 and len(done) == 12
    assert r["output_lens"] == [q.output_len for q in requests]  # ignore_eos: exact lengths
    # the server adds nothing to token-id prompts
    assert r["input_lens"] == [q.prompt_len for q in requests]
    assert r["total_output_tokens"] == sum(q.output_len for q in requests)
    assert 0 < r["median_ttft_ms"] <= r["p99_ttft_ms"] <= r["mean_e2el_ms"] * 2
    assert 0 < r["mean_itl_ms"] and r["mean_tpot_ms"] > 0
    assert r["request_goodput"] == pytest.approx(r["request_throughput"])  # a 60 s TTFT SLO holds
    assert r["model_id"] == "qwen3-coder-tiny" and r["request_rate"] == 30
    assert r["client_cpu_s"] > 0  # this process's CPU time during the load (the test server's too)
    from disaggsdk.records.host_cpu import host_cpu

    assert r["cpu"] == host_cpu().as_json()  # every figure names the CPU it was taken on
    assert all(len(r[k]) == 12 for k in ("latencies", "start_times", "generated_texts", "errors", "itls"))
    assert all(t for t in r["generated_texts"]) and r["errors"] == [""] * 12
    assert sum(r["latencies"]) / 12 * 1e3 == pytest.approx(r["mean_e2el_ms"])  # latency is vLLM's E2EL
    assert all(len(itls) <= n - 1 for itls, n in zip(r["itls"], r["output_lens"]))  # one gap per chunk, not per token
    assert 1 <= r["max_concurrent_requests"] <= 12 and r["max_output_tokens_per_s"] > 0
    json.dumps(r)  # the result is plain JSON


def test_chat_endpoint_streams_messages_and_goodput_is_null_without_slo(server):
    from disaggsdk.bench.dataset import BenchRequest

    requests = [BenchRequest(f"write a function number {i}", 8, 6) for i in range(4)]
    r = bench(server.url, requests, LoadShape(max_concurrency=2), api_key="k",
              options=RequestOptions("/v1/chat/completions"), percentile_metrics=("ttft", "itl"))
    assert r["completed"] == 4 and r["backend"] == "openai-chat" and r["endpoint"] == "/v1/chat/completions"
    assert r["output_lens"] == [6] * 4 and all(r["generated_texts"])  # ignore_eos by default
    assert r["input_lens"][0] > 8  # the server's usage: the chat template's tokens count
    assert r["request_goodput"] is None and "p99_ttft_ms" in r and "p99_itl_ms" in r
    assert "p99_tpot_ms" not in r and "mean_tpot_ms" in r  # percentiles only where asked
    assert 1 <= r["max_concurrent_requests"] <= 4  # vLLM counts a request in every second it spans
    with pytest.raises(BenchError, match="text prompts"):
        bench(server.url, random_requests(1, 4, 2), api_key="k", options=RequestOptions("/v1/chat/completions"))


def test_bench_reports_an_unreachable_or_refusing_server(server):
    with pytest.raises(BenchError, match="API key"):
        bench(server.url, random_requests(1, 4, 2), api_key="wrong")
    too_long = [random_requests(1, 4, 2)[0].__class__([1] * 8, 8, 100_000)]
    with pytest.raises(BenchError, match="every request failed"):
        bench(server.url, too_long, model="qwen3-coder-tiny", api_key="k")
    with pytest.raises(BenchError, match="initial test request failed"):  # vLLM's test request, as the CLI sends
        bench(server.url, too_long, LoadShape(initial_test=True), model="qwen3-coder-tiny", api_key="k")


def test_random_lengths_follow_the_range_ratio_and_the_seed():
    reqs = random_requests(200, input_len=100, output_len=10, range_ratio=0.2, seed=3)
    assert all(80 <= q.prompt_len <= 120 and len(q.prompt) == q.prompt_len for q in reqs)
    assert all(8 <= q.output_len <= 12 for q in reqs)
    assert len({q.prompt_len for q in reqs}) > 10
    assert reqs == random_requests(200, input_len=100, output_len=10, range_ratio=0.2, seed=3)
    with pytest.raises(DatasetError, match="range-ratio"):
        random_requests(2, 10, 10, range_ratio=1.0)


def test_sharegpt_file_gives_first_turn_prompts_and_reply_lengths(tmp_path):
    convs = [{"conversations": [{"from": "human", "value": f"question number {i}?"},
                                {"from": "gpt", "value": "an answer " * (i + 1)}]} for i in range(6)]
    convs.append({"conversations": [{"from": "human", "value": "hi"}]})  # one turn: skipped
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    reqs = sharegpt_requests(path, 4, len, seed=0)
    assert len(reqs) == 4
    for q in reqs:
        i = int(q.prompt.split()[-1].rstrip("?"))
        assert q.prompt_len == len(q.prompt) and q.output_len == len("an answer " * (i + 1))
    assert {q.output_len for q in sharegpt_requests(path, 3, len, output_len=7)} == {7}
    with pytest.raises(DatasetError, match="usable"):
        sharegpt_requests(path, 10, len)


def test_slo_parsing_and_load_shape_checks():
    assert parse_slos("ttft=500,tpot=50") == {"ttft": 500.0, "tpot": 50.0}
    assert parse_goodput(["ttft:500", "tpot:50"]) == parse_slos("ttft=500,tpot=50")  # vLLM's syntax, same SLOs
    assert parse_slos(None) == {} == parse_goodput(None)
    with pytest.raises(BenchError, match="ttft, tpot or e2el"):
        parse_slos("itl=3")
    with pytest.raises(BenchError, match="KEY:MS"):
        parse_goodput(["ttft=500"])
    with pytest.raises(BenchError, match="negative"):
        parse_goodput(["e2el:-1"])
    with pytest.raises(BenchError):
        LoadShape(qps=0)
    assert math.isinf(LoadShape().qps)


@pytest.mark.deps_smoke  # make test-latest / test-oldest (tools/deps_check.py)
def test_bench_command_against_a_url_writes_vllm_json(server, run_cli, tmp_path):
    out = tmp_path / "result.json"
    p = run_cli("bench", server.url, "--num-prompts", "4", "--input-len", "16", "--output-len", "4", "--qps", "50",
                "--api-key", "k", "--json", "--output", str(out), "--slo", "ttft=100000")
    assert p.returncode == 0, p.stderr
    printed = json.loads(p.stdout)
    assert printed["completed"] == 4 and "p99_itl_ms" in printed and "request_goodput" in printed
    assert json.loads(out.read_text())["total_output_tokens"] == 16
    assert "mean_ttft_ms" in p.stderr  # the summary table goes to stderr with --json


def test_bench_command_takes_vllm_spellings_and_saves_vllm_named_results(server, run_cli, tmp_path):
    p = run_cli("bench", "--base-url", server.url, "--backend", "openai", "--dataset-name", "random",
                "--random-input-len", "16", "--random-output-len", "4", "--random-range-ratio", "0",
                "--num-prompts", "3", "--request-rate", "50", "--max-concurrency", "2", "--ignore-eos",
                "--temperature", "0", "--goodput", "ttft:100000", "e2el:100000", "--percentile-metrics",
                "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99.9", "--save-result", "--save-detailed",
                "--result-dir", str(tmp_path / "results"), "--api-key", "k", "--num-warmups", "1")
    assert p.returncode == 0, p.stderr
    (saved,) = (tmp_path / "results").iterdir()
    # vLLM's default name: BACKEND-RATEqps-concurrencyN-MODEL-DATE.json
    assert saved.name.startswith("openai-50.0qps-concurrency2-qwen3-coder-tiny-") and saved.suffix == ".json"
    r = json.loads(saved.read_text())
    assert r["completed"] == 3 and r["max_concurrency"] == 2 and r["request_goodput"] == r["request_throughput"]
    assert "p99.9_itl_ms" in r and "p50_e2el_ms" in r and r["output_lens"] == [4, 4, 4]
    p = run_cli("bench", server.url, "--num-prompts", "2", "--input-len", "8", "--output-len", "3", "--api-key", "k",
                "--endpoint", "/v1/chat/completions", "--tokenizer", "qwen3-coder-tiny",
                "--result-filename", "chat.json", "--result-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    r = json.loads((tmp_path / "chat.json").read_text())
    assert r["backend"] == "openai-chat" and r["completed"] == 2 and r["output_lens"] == [3, 3]


SWEEP_LOAD = ("--num-prompts", "4", "--input-len", "16", "--output-len", "4", "--api-key", "k", "--json")


def test_bench_sweeps_a_list_of_rates_for_the_goodput_rate_in_rounds(server, run_cli):
    p = run_cli("bench", server.url, "--request-rate", "40,20", "--goodput", "ttft:100000", "--repeat", "2",
                *SWEEP_LOAD)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["rates"] == [20.0, 40.0] and doc["slos_ms"] == {"ttft": 100000.0}
    assert [(row["round"], row["request_rate"]) for row in doc["sweep"]] == [(0, 20.0), (0, 40.0), (1, 20.0), (1, 40.0)]
    assert all(row["slo_attainment"] == 1.0 and row["completed"] == 4 for row in doc["sweep"])
    assert doc["goodput_request_rate"] == 40.0 and doc["goodput_rounds"] == [40.0, 40.0]
    assert doc["cpu"]["model_name"] and doc["target"] == server.url
    assert "goodput 40.00 req/s" in p.stderr  # the person's line, with the table, on stderr under --json


def test_bench_searches_for_the_goodput_rate_from_the_flat_out_run(server, run_cli):
    p = run_cli("bench", server.url, "--request-rate", "search", "--search-steps", "2", "--goodput",
                "ttft:0.001", *SWEEP_LOAD)  # no request answers within a microsecond: every rate misses
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    flat_out = doc["sweep"][0]
    assert flat_out["request_rate"] == "inf" and flat_out["slo_attainment"] == 0.0
    half = flat_out["request_throughput"] / 2
    assert [row["request_rate"] for row in doc["sweep"][1:]] == [pytest.approx(half), pytest.approx(half / 2)]
    assert doc["goodput_request_rate"] == 0.0
    p = run_cli("bench", server.url, "--request-rate", "search", "--goodput", "ttft:100000", *SWEEP_LOAD)
    doc = json.loads(p.stdout)  # met flat out: one run, its throughput is the goodput
    assert len(doc["sweep"]) == 1 and doc["goodput_request_rate"] == doc["sweep"][0]["request_throughput"]


def test_one_bench_command_sweeps_a_spec_and_a_server_and_sets_their_goodput_side_by_side(server, run_cli):
    p = run_cli("bench", "specs/tiny_pd.yaml", server.url, "--request-rate", "10,20", "--goodput", "ttft:100000",
                "--no-live", *SWEEP_LOAD)
    assert p.returncode == 0, p.stderr
    docs = json.loads(p.stdout)
    assert list(docs) == ["disaggregated specs/tiny_pd.yaml", server.url]
    for doc in docs.values():
        assert [row["request_rate"] for row in doc["sweep"]] == [10.0, 20.0] and doc["goodput_request_rate"] == 20.0
    assert "goodput disaggregated specs/tiny_pd.yaml / " in p.stderr


@pytest.mark.parametrize("argv, message", [
    (["--request-rate", "1,2"], "give the SLOs it must meet"),
    (["--request-rate", "fast"], "--request-rate 'fast'"),
    (["--request-rate", "search", "--goodput", "ttft:5", "--goodput-target", "2"], "--goodput-target"),
])
def test_bench_refuses_a_sweep_that_cannot_run_before_sending(run_cli, argv, message):
    p = run_cli("bench", "http://127.0.0.1:9", *argv)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("argv, message", [
    (["--backend", "openai", "--endpoint", "/v1/chat/completions"], "--backend openai sends to"),
    (["--dataset-name", "sharegpt"], "--dataset-path"),
    (["--percentile-metrics", "ttft,queue"], "--percentile-metrics"),
    (["--goodput", "ttft=5"], "KEY:MS"),
    (["--metric-percentiles", "0"], "--metric-percentiles"),
])
def test_bench_command_refuses_options_that_cannot_work_before_sending(run_cli, argv, message):
    p = run_cli("bench", "http://127.0.0.1:9", *argv)  # nothing listens there: options fail first
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr


def test_arrival_gaps_have_the_rate_and_burstiness_asked_for():
    from statistics import fmean, pstdev

    from disaggsdk.bench.serve_bench import arrival_gaps_s

    assert arrival_gaps_s(LoadShape(), 5) == [0.0] * 5
    poisson = arrival_gaps_s(LoadShape(qps=4, seed=1), 4001)[:-1]
    assert fmean(poisson) == pytest.approx(0.25, rel=0.05)
    assert pstdev(poisson) / fmean(poisson) == pytest.approx(1.0, rel=0.1)  # exponential gaps
    bursty = arrival_gaps_s(LoadShape(qps=4, burstiness=0.25, seed=1), 4001)[:-1]
    assert fmean(bursty) == pytest.approx(0.25, rel=0.1)
    assert pstdev(bursty) / fmean(bursty) == pytest.approx(2.0, rel=0.15)  # CV = 1 / sqrt(shape)


def test_median_run_picks_a_real_run_and_lists_all():
    from disaggsdk.bench.serve_bench import median_run

    runs = [{"p99_itl_ms": v, "id": i} for i, v in enumerate([30.0, 10.0, 20.0])]
    chosen = median_run(runs, "p99_itl_ms")
    assert chosen["id"] == 2 and chosen["repeat_p99_itl_ms"] == [30.0, 10.0, 20.0]
    assert median_run(runs[:1], "p99_itl_ms") == runs[0]
    with pytest.raises(ValueError):
        median_run([], "p99_itl_ms")


def test_bench_replays_a_jsonl_trace_as_vllms_custom_dataset(server, run_cli, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"input_len": 12, "output_len": 3}\n{"prompt_token_ids": [5, 6, 7, 8], "output_tokens": 2}\n')
    p = run_cli("bench", server.url, "--dataset-path", str(trace), "--num-prompts", "4", "--api-key", "k", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["completed"] == 4 and set(doc["output_lens"]) <= {2, 3} and set(doc["input_lens"]) <= {4, 12}
    p = run_cli("bench", server.url, "--dataset-name", "custom", "--api-key", "k")
    assert p.returncode == 2 and "needs --dataset-path" in p.stderr and "Traceback" not in p.stderr
