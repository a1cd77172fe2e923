"""KV transfer across a shaped link, measured: `disaggsdk testbed bench`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import attrs

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    from disaggsdk.calibrate.link_bench_node import LinkBenchConfig, LinkRow
    from disaggsdk.spec.types import Spec

MIB = 1 << 20
GOODPUT_MIN_LAYER_BYTES = MIB  # the issue judges goodput where a layer moves at least 1 MiB


class LinkBenchFailed(DisaggError):
    """The node side stopped without a result (its stderr, which the bench passes on, says why)."""


class LinkBenchSummary(TypedDict):
    """The figures the issue accepts on, over the rows of the shaped rates."""

    min_kv_goodput_fraction: float | None  # after_forward rows with >= 1 MiB a layer
    max_streaming_exposed_over_floor: float | None
    min_streaming_exposed_over_floor: float | None
    max_streaming_exposed_over_strict_floor: float | None
    max_abs_sim_ttft_error: float | None


class LinkBenchResult(TypedDict):
    """What `disaggsdk testbed bench` prints."""

    command: str
    cpu: dict[str, object]
    model: str
    kv_dtype: str
    num_layers: int
    config: LinkBenchConfig
    engine_profile: dict[str, float | str]  # the simulator's starting point, fitted by timing the engine in node 0
    rows: list[LinkRow]
    summary: LinkBenchSummary


def summarize(rows: Sequence[LinkRow]) -> LinkBenchSummary:
    """The acceptance figures over the shaped (non-reference) rows; None where no row applies."""
    shaped = [r for r in rows if not r["reference"]]
    goodput = [r["kv_goodput_fraction"] for r in shaped
               if r["kv_goodput_fraction"] is not None and r["kv_bytes_per_layer"] >= GOODPUT_MIN_LAYER_BYTES]
    exposed = [r["exposed_over_floor"] for r in shaped if r["mode"] == "streaming"]
    strict = [r["exposed_over_strict_floor"] for r in shaped if r["mode"] == "streaming"]
    errors = [abs(r["sim_ttft_error"]) for r in shaped]
    return {"min_kv_goodput_fraction": min(goodput) if goodput else None,
            "max_streaming_exposed_over_floor": max(exposed) if exposed else None,
            "min_streaming_exposed_over_floor": min(exposed) if exposed else None,
            "max_streaming_exposed_over_strict_floor": max(strict) if strict else None,
            "max_abs_sim_ttft_error": max(errors) if errors else None}


def testbed_spec(spec: Spec) -> Spec:
    """``spec`` as the testbed runs it: tcp (the nodes share no memory), one rank a plan node (so
    prefill is plan node 0 and decode plan node 1, pinned to testbed nodes 0 and 1), on Ray.

    Raises:
        DisaggError: not one prefill and one decode instance of one rank each on the CPU.
    """
    if spec.device != "cpu" or spec.prefill.replicas * spec.prefill.tp != 1 or spec.decode.replicas * spec.decode.tp != 1:
        raise DisaggError(f"{spec.name}: the link bench runs one prefill and one decode instance of one rank each on "
                          "the CPU (e.g. specs/tiny_pd.yaml)")
    return attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpus_per_node=1),
                        transport=attrs.evolve(spec.transport, provider="tcp"))


def long_context_model(model: str, tokens: int, directory: Path) -> str:
    """``model`` if it holds ``tokens`` of context, else a twin under ``directory`` that does: its
    checkpoint's files linked, config.json's ``max_position_embeddings`` raised to ``tokens``.

    The tiny models were trained at 4,096 positions; RoPE is defined at every position, so the
    twin runs a 16k prompt with the same weights and the same KV bytes a token, which is all a
    transfer measurement needs (what it would say past its trained length is beside the point).
    ``directory`` must be one every testbed node sees (not /tmp, each node has its own).

    Raises:
        DisaggError: the model has no checkpoint directory to link from.
    """
    from disaggsdk.models import resolve_model
    from disaggsdk.models.shipped import checkpoint_directory

    if resolve_model(model).hf_config.get("max_position_embeddings", 0) >= tokens:
        return model
    source = checkpoint_directory(model)
    if source is None or not (source / "config.json").is_file():
        raise DisaggError(f"{model}: holds fewer than {tokens} tokens and has no checkpoint directory to raise that "
                          "from; give shorter --input-lens or a model with a longer context")
    twin = directory / f"{source.name}-ctx{tokens}"
    twin.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        link = twin / item.name
        if item.name != "config.json" and not link.exists():
            link.symlink_to(item.resolve())
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    config["max_position_embeddings"] = tokens
    (twin / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return str(twin)


def run_link_bench(spec: Spec, input_lens: Sequence[int], ratios: Sequence[float], num_prompts: int,
                   reference_mbit: float, name: str = "linkbench", calibration_rounds: int = 1,
                   on_progress: Callable[[str], None] | None = None) -> LinkBenchResult:
    """Build the testbed, run the node side, answer its rate requests, take the testbed down.

    Raises:
        TestbedUnavailable: not root, or iproute2 missing.
        LinkBenchFailed: the node side stopped without a result.
    """
    from disaggsdk.calibrate.link_bench_node import LinkBenchConfig
    from disaggsdk.models import resolve_model
    from disaggsdk.records.host_cpu import host_cpu
    from disaggsdk.sim.hardware import user_profile_dir
    from disaggsdk.spec import spec_to_yaml
    from disaggsdk.testbed import LinkSpec, RayOptions, up
    from disaggsdk.testbed.ray_cluster import ray_env

    spec = testbed_spec(spec)
    model = long_context_model(spec.model, max(input_lens) + 1, user_profile_dir().parent / "link-bench")
    spec = attrs.evolve(spec, model=model)
    ray = RayOptions(num_cpus=1, resources={"disaggsdk_slot": 1}, object_store_bytes=80 << 20)
    with up(nodes=2, link=LinkSpec(rate_mbit=reference_mbit), name=name, ray=ray) as testbed:
        spec = attrs.evolve(spec, launch=attrs.evolve(spec.launch, backend="ray", address=testbed.ray_address))
        config = LinkBenchConfig(spec_yaml=spec_to_yaml(spec), input_lens=list(input_lens), ratios=list(ratios),
                                 num_prompts=num_prompts, reference_mbit=reference_mbit,
                                 calibration_rounds=calibration_rounds)
        node = testbed.node(0)
        proc = node.popen([sys.executable, "-m", "disaggsdk.calibrate.link_bench_node", json.dumps(config)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
                          env={**ray_env(), "PYTHONUNBUFFERED": "1"})
        rows: list[LinkRow] | None = None
        engine_profile: dict[str, float | str] = {}
        try:
            assert proc.stdout is not None and proc.stdin is not None
            for line in proc.stdout:
                try:
                    message = json.loads(line)
                except ValueError:  # a library printing to stdout: pass it on, it is not ours
                    sys.stderr.write(line)
                    continue
                if "set_link_mbit" in message:
                    rate = float(message["set_link_mbit"])
                    testbed = testbed.set_link(LinkSpec(rate_mbit=rate))
                    if on_progress:
                        on_progress(f"link at {rate:.1f} Mbit/s")
                    proc.stdin.write("ok\n")
                    proc.stdin.flush()
                elif "result" in message:
                    rows, engine_profile = message["result"], message["engine_profile"]
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()  # the nsenter; `down` ends what runs in the node
                proc.wait()
        if rows is None:
            raise LinkBenchFailed(f"the link bench in node 0 stopped ({proc.returncode}) without a result; "
                                  "its messages above say why")
    arch = resolve_model(spec.model)
    return {"command": " ".join(sys.argv), "cpu": host_cpu().as_json(), "model": spec.model, "kv_dtype": spec.kv.dtype,
            "num_layers": arch.num_layers, "config": config, "engine_profile": engine_profile, "rows": rows,
            "summary": summarize(rows)}
