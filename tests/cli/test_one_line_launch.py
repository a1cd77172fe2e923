"""`disaggsdk launch --model M --device cpu --decoders 2` (issue 38 item 6): a deployment from flags
builds the spec a YAML file would, says which flag is wrong, and serves the openai client."""

from __future__ import annotations

import io
import signal

import pytest
from rich.console import Console

from disaggsdk.cli.one_line_spec import spec_from_flags
from disaggsdk.spec import load_spec, parse_spec_yaml, spec_to_yaml


def test_flags_build_the_spec_the_yaml_would(run_cli):
    p = run_cli("launch", "--model", "qwen3-coder-tiny", "--device", "cpu", "--decoders", "2", "--print-spec")
    assert p.returncode == 0, p.stderr
    spec = parse_spec_yaml(p.stdout)
    # the tiny_local.yaml deployment, but for its name and the demo's port and host count
    local = load_spec("specs/tiny_local.yaml")
    assert (spec.model, spec.device, spec.hardware.gpu, spec.kv.dtype, spec.transport.provider) == (
        local.model, local.device, local.hardware.gpu, local.kv.dtype, local.transport.provider)
    assert (spec.prefill, spec.decode) == (local.prefill, local.decode)
    assert spec_to_yaml(spec) == p.stdout  # what it prints is what it launches
    r1 = spec_from_flags("deepseek-r1", None, {"--decode-dp": 8, "--decode-ep": 8, "--prefill-tp": 8})
    assert (r1.device, r1.decode.dp, r1.decode.ep, r1.prefill.tp) == ("cuda", 8, 8, 8)


def test_bad_flags_name_the_flag_and_exit_2(run_cli):
    p = run_cli("launch", "--model", "qwen3-coder-tiny", "--device", "cpu", "--decode-tp", "3")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--decode-tp ($.decode.tp): tp=3" in p.stderr
    p = run_cli("launch", "specs/tiny_local.yaml", "--decoders", "2")
    assert p.returncode == 2 and "specs/tiny_local.yaml is a spec and --decoders describes another" in p.stderr
    p = run_cli("launch")
    assert p.returncode == 2 and "--model MODEL" in p.stderr
    p = run_cli("launch", "--model", "no-such-model", "--device", "cpu")
    assert p.returncode == 2 and "--model ($.model)" in p.stderr


def test_a_one_line_launch_serves_the_openai_client():
    import openai

    from tests.conftest import start_cli_server
    from tests.serve.test_launch_cli import descendants, reap, still_alive

    proc, url = start_cli_server("launch", "--model", "qwen3-coder-tiny", "--device", "cpu", "--decoders", "2",
                                 "--port", "0", "--no-live", timeout_s=180)
    kids: set[int] = set()
    try:
        kids = descendants(proc.pid)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        answer = client.completions.create(model=client.models.list().data[0].id, prompt="def f(x):", max_tokens=6)
        assert answer.usage.completion_tokens > 0
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 143, out
        assert not still_alive(kids)
    finally:
        reap(proc, kids)


def test_launch_takes_vllms_otlp_traces_endpoint_flag_into_the_spec_and_refuses_a_bad_url(run_cli):
    p = run_cli("launch", "specs/tiny_pd.yaml", "--otlp-traces-endpoint", "http://127.0.0.1:4318/v1/traces",
                "--print-spec")
    assert p.returncode == 0, p.stderr
    assert "otlp_traces_endpoint: http://127.0.0.1:4318/v1/traces" in p.stdout
    p = run_cli("launch", "specs/tiny_pd.yaml", "--otlp-traces-endpoint", "ftp://collector", "--print-spec")
    assert p.returncode == 2 and "--otlp-traces-endpoint: must be an http:// or https:// URL" in p.stderr
    assert "Traceback" not in p.stderr


# (flag, value drawn, the spec key it sets, the value the key takes)
SERVE_OVERRIDES = [
    ("--port", lambda rng: str(rng.randint(0, 65535)), ("serve", "port"), int),
    ("--host", lambda rng: rng.choice(["0.0.0.0", "::", "10.1.2.3"]), ("serve", "host"), str),
    ("--served-model-name", lambda rng: rng.choice(["m", "coder-v2"]), ("serve", "model_name"), str),
    ("--otlp-traces-endpoint", lambda rng: "http://127.0.0.1:4318/v1/traces", ("serve", "otlp_traces_endpoint"), str),
    ("--access-log", None, ("serve", "access_log"), True),
    ("--address", lambda rng: rng.choice(["auto", "10.0.0.1:6379"]), ("launch", "address"), str),
]


def test_print_spec_prints_every_override_the_launch_uses(capsys, monkeypatch):
    # --print-spec ignored --port (issue 55): random sets of the flags that set a key, each found in the printed
    # spec, and that spec is the one launch starts
    import random

    import disaggsdk.face.deployment as deployment
    from disaggsdk.cli.launch_cmd import launch_spec
    from disaggsdk.cli.main import build_parser, main
    from disaggsdk.spec import parse_spec_yaml

    class Started(Exception):
        """What `launch` was given, instead of a deployment."""

    def launch(spec, **kwargs):
        raise Started(spec, kwargs)

    monkeypatch.setattr(deployment, "launch", launch)
    rng = random.Random(55)
    for _ in range(12):
        argv = ["launch", "specs/r1_tp.yaml", *(["--tiny"] if rng.random() < 0.5 else [])]
        expected = {}
        for flag, draw, (section, key), kind in rng.sample(SERVE_OVERRIDES, rng.randint(1, len(SERVE_OVERRIDES))):
            value = draw(rng) if draw else None
            argv += [flag] + ([value] if value is not None else [])
            expected[(section, key)] = True if kind is True else kind(value)
        assert main([*argv, "--print-spec"]) == 0
        printed = parse_spec_yaml(capsys.readouterr().out)
        for (section, key), value in expected.items():
            assert getattr(getattr(printed, section), key) == value, (argv, section, key)
        assert (printed.model == "deepseek-r1-tiny") == ("--tiny" in argv)
        with pytest.raises(Started) as started:
            launch_spec(build_parser().parse_args(argv), Console(file=io.StringIO()), colocated=False)
        spec, kwargs = started.value.args
        assert spec == printed and kwargs["port"] is None and "host" not in kwargs, argv


def test_a_port_out_of_range_is_one_line_naming_the_flag(run_cli):
    p = run_cli("launch", "specs/tiny_local.yaml", "--port", "70000", "--print-spec")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip() == "error: --port: must be a TCP port in 0..65535 (0 picks a free one), got 70000"
