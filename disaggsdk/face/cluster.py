"""The fluent builder: ``Cluster().prefill(tp=8).decoders(3, tp=8).model("qwen3-coder")``.

Every call returns a new `Cluster` around a new frozen `Spec`, so re-running a notebook cell never
changes a value another cell holds. Single values are checked at each call; rules that need the
whole spec (tp against the model's heads) are checked by `.spec`, `.plan()` and `.launch()`.
"""

from __future__ import annotations

import functools
import html
import inspect
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import attrs

from disaggsdk.errors import SpecError
from disaggsdk.spec.engine_settings import SpecMethod, WeightDtype
from disaggsdk.spec.field_checks import FieldErrors
from disaggsdk.spec.kv import KV, Provider, TransferSettings
from disaggsdk.spec.rules import check_spec
from disaggsdk.spec.serving import Routing
from disaggsdk.spec.topology import Hardware
from disaggsdk.spec.types import Device, Spec
from disaggsdk.spec.yaml_io import load_spec, spec_to_yaml

if TYPE_CHECKING:
    from disaggsdk.face.compare import LayoutComparison
    from disaggsdk.face.deployment import Deployment
    from disaggsdk.plan import Plan

Section = TypeVar("Section", bound=attrs.AttrsInstance)
SectionArgs = ParamSpec("SectionArgs")
CallArgs = ParamSpec("CallArgs")

# the builder method that sets each top-level spec key (a section's keys are that method's keywords)
_METHOD_OF_KEY = {"prefill": "prefill", "decode": "decoders", "name": "named", "launch": "on_ray"}
# how a key that is a method's first positional argument is written in a hint
_POSITIONAL = {("decode", "replicas"): "Cluster.decoders(n)", ("prefill", "replicas"): "Cluster.prefills(n)",
               ("transport", "provider"): "Cluster.transport(provider)",
               ("speculative", "method"): "Cluster.speculative(method)"}
_SPEC_PATH = re.compile(r"\$\.([a-z_]+)(?:\.([a-z_]+))?")
# a key a message names without its "$." ("raise prefill.tp", "hardware.cpu_memory_gb"): a section's, so
# that "the model's" or "disaggsdk.launch" never reads as one
_BARE_KEY = re.compile(r"(?<![\w.$])(" + "|".join(f.name for f in attrs.fields(Spec)) + r")\.([a-z_]+)")


def builder_call(path: str) -> str | None:
    """The `Cluster` call that sets the spec key at ``path`` (``$.decode.tp`` -> ``Cluster.decoders(n, tp=...)``),
    or None where the builder has no method for it (a YAML-only key)."""
    match = _SPEC_PATH.fullmatch(path)
    if match is None:
        return None
    section, key = match.groups()
    if (section, key) in _POSITIONAL:
        return _POSITIONAL[section, key]
    name = _METHOD_OF_KEY.get(section, section)
    method = getattr(Cluster, name, None)
    if not callable(method):
        return None
    first = "n, " if name == "decoders" else ""
    if key is None:  # a top-level scalar: model, device, seed, name
        return f"Cluster.{name}(...)"
    if key not in inspect.signature(method).parameters:
        return None
    return f"Cluster.{name}({first}{key}=...)"


def with_builder_hint(problem: str) -> str:
    """A spec problem (``$.hardware.gpu: ... set $.device to ...``) with the `Cluster` calls that fix it
    appended, for errors raised from the builder: the spec path stays, the Python call follows."""
    calls = []
    found = sorted([*_SPEC_PATH.finditer(problem), *_BARE_KEY.finditer(problem)], key=lambda m: m.start())
    for match in found:
        path = match.group(0) if match.group(0).startswith("$.") else f"$.{match.group(0)}"
        call = builder_call(path)
        if call is not None and call not in calls:
            calls.append(call)
    return f"{problem} (in Python: {' or '.join(calls)})" if calls else problem


class BuilderFieldErrors(FieldErrors):
    """`FieldErrors` raised by a `Cluster` method, its message led by the call (``Cluster.prefill(tp=0): ...``).

    Attributes:
        detail: the message without the call.
    """

    detail: str

    def __init__(self, call: str, cause: FieldErrors):
        super().__init__(cause.owner, cause.problems)
        self.detail = cause.detail if isinstance(cause, BuilderFieldErrors) else str(cause)
        self.args = (f"{call}: {self.detail}",)


def _names_the_call(method: Callable[Concatenate[Cluster, CallArgs], Cluster],
                    ) -> Callable[Concatenate[Cluster, CallArgs], Cluster]:
    """``method`` whose bad values fail with the call in front: ``Cluster.prefill(tp=0): Role.tp: must be ...``."""
    @functools.wraps(method)
    def named(self: Cluster, /, *args: CallArgs.args, **kwargs: CallArgs.kwargs) -> Cluster:
        try:
            return method(self, *args, **kwargs)
        except FieldErrors as exc:  # the outermost call names it: ``decoders(3, tp=0)``, not the ``decode`` it calls
            shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items() if v is not None]
            raise BuilderFieldErrors(f"{method.__qualname__}({', '.join(shown)})", exc) from None
    return named


def _set(section: Section, **changes: object) -> Section:
    """``section`` with the given fields changed; None keeps a field as it is."""
    given = {name: value for name, value in changes.items() if value is not None}
    # what attrs.evolve does, spelled out: mypy's attrs plugin cannot evolve a TypeVar's instance
    return type(section)(**{**attrs.asdict(section, recurse=False), **given})


def _section_method(name: str, section: Callable[SectionArgs, Section], get: Callable[[Spec], Section],
                    put: Callable[[Spec, Section], Spec],
                    doc: str) -> Callable[Concatenate[Cluster, SectionArgs], Cluster]:
    """A `Cluster` method whose arguments are the fields of the spec section ``section`` (its attrs
    ``__init__``'s, so the list is declared once, in the spec), changing only those given.

    Args:
        name: the method's name (the section's YAML key).
        section: the section's class.
        get, put: read the section from a spec, and a spec with the section replaced.
        doc: the method's docstring.
    """
    signature = inspect.signature(section)
    names = list(signature.parameters)

    def method(self: Cluster, /, *args: SectionArgs.args, **kwargs: SectionArgs.kwargs) -> Cluster:
        return Cluster(put(self.draft, _set(get(self.draft), **dict(zip(names, args)), **kwargs)))

    method.__name__, method.__qualname__, method.__doc__ = name, f"Cluster.{name}", doc
    method = _names_the_call(method)
    # help() and Jupyter show the section's keyword arguments, not *args/**kwargs (`inspect.signature`
    # reads a function's __signature__ first)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    method.__dict__["__signature__"] = signature.replace(
        parameters=[self_param, *signature.parameters.values()], return_annotation="Cluster")
    return method


def _print_progress(line: str) -> None:
    """A progress line on stdout: a notebook shows stdout as the cell's output (stderr: a red box)."""
    print(line, flush=True)


@attrs.frozen
class Cluster:
    """A deployment being described. `draft` is the spec so far, not yet cross-checked."""

    draft: Spec = attrs.field(factory=Spec)

    # roles
    @_names_the_call
    def prefill(self, tp: int | None = None, dp: int | None = None, replicas: int | None = None,
                ep: int | None = None) -> Cluster:
        """Shape of each prefill instance, and how many there are; ``ep=tp*dp`` partitions the routed experts."""
        role = _set(self.draft.prefill, tp=tp, dp=dp, replicas=replicas, ep=ep)
        return Cluster(attrs.evolve(self.draft, prefill=role))

    @_names_the_call
    def decode(self, tp: int | None = None, dp: int | None = None, replicas: int | None = None,
               ep: int | None = None) -> Cluster:
        """Shape of each decode instance, and how many there are; ``ep=tp*dp`` partitions the routed experts."""
        return Cluster(attrs.evolve(self.draft, decode=_set(self.draft.decode, tp=tp, dp=dp, replicas=replicas, ep=ep)))

    @_names_the_call
    def decoders(self, replicas: int, tp: int | None = None, dp: int | None = None, ep: int | None = None) -> Cluster:
        """``replicas`` decode instances of ``tp`` x ``dp`` ranks each (``ep``: see `decode`)."""
        return self.decode(tp=tp, dp=dp, replicas=replicas, ep=ep)

    @_names_the_call
    def prefills(self, replicas: int, tp: int | None = None, dp: int | None = None, ep: int | None = None) -> Cluster:
        """``replicas`` prefill instances of ``tp`` x ``dp`` ranks each (``ep``: see `prefill`)."""
        return self.prefill(tp=tp, dp=dp, replicas=replicas, ep=ep)

    # everything else
    @_names_the_call
    def model(self, model: str) -> Cluster:
        """A catalog name (``qwen3-coder``, ``deepseek-r1``, ``*-tiny``) or a checkpoint directory."""
        return Cluster(attrs.evolve(self.draft, model=model))

    @_names_the_call
    def named(self, name: str) -> Cluster:
        """Give the deployment a name (shown in plans and dashboards)."""
        return Cluster(attrs.evolve(self.draft, name=name))

    @_names_the_call
    def device(self, device: Device) -> Cluster:
        """``cpu`` or ``cuda``. The hardware follows: ``cpu`` makes ``$.hardware.gpu`` "cpu" (a CPU rank is
        one process), and ``cuda`` after ``cpu`` brings back the default GPU kind; call ``.hardware(gpu=...)``
        afterwards for another one."""
        gpu = self.draft.hardware.gpu
        if device == "cpu":
            gpu = "cpu"
        elif gpu == "cpu":
            gpu = Hardware().gpu
        return Cluster(attrs.evolve(self.draft, device=device, hardware=attrs.evolve(self.draft.hardware, gpu=gpu)))

    @_names_the_call
    def seed(self, seed: int) -> Cluster:
        """Seed of every random choice (replica-set assignment, tiny weights, sampling)."""
        return Cluster(attrs.evolve(self.draft, seed=seed))

    hardware = _section_method(
        "hardware", Hardware, lambda spec: spec.hardware, lambda spec, hardware: attrs.evolve(spec, hardware=hardware),
        """What one node offers (the keys of `Hardware`).""")
    kv = _section_method(
        "kv", KV, lambda spec: spec.kv, lambda spec, kv: attrs.evolve(spec, kv=kv),
        """KV cache page layout (``HND``/``NHD``), tokens per page and dtype (`KV`'s keys).""")
    transfer = _section_method(
        "transfer", TransferSettings, lambda spec: spec.transfer, lambda spec, transfer: attrs.evolve(spec, transfer=transfer),
        """How the KV moves: layer ``streaming``, the per-attempt ``deadline_s``, and the prompts a decode
        instance prefills itself (at most ``max_local_prefill_tokens`` missing from its prefix cache;
        see `TransferSettings`).""")

    @_names_the_call
    def engine(self, num_pages: int | None = None, max_num_batched_tokens: int | None = None,
               max_num_seqs: int | None = None, prefix_caching: bool | None = None,
               memory_utilization: float | None = None, dtype: WeightDtype | None = None,
               max_model_len: int | None = None) -> Cluster:
        """Per-rank engine sizes, the prefix cache (on by default, as vLLM's), the fraction of device memory the
        rank may fill, the weights' dtype and the longest request (see `EngineSettings`)."""
        engine = _set(self.draft.engine, num_pages=num_pages, max_num_batched_tokens=max_num_batched_tokens,
                      max_num_seqs=max_num_seqs, prefix_caching=prefix_caching,
                      memory_utilization=memory_utilization, dtype=dtype, max_model_len=max_model_len)
        return Cluster(attrs.evolve(self.draft, engine=engine))

    @_names_the_call
    def transport(self, provider: Provider, same_host_copy: bool | None = None) -> Cluster:
        """``auto``, ``shm``, ``tcp``, ``efa`` or ``verbs``; ``same_host_copy`` see `Transport`."""
        return Cluster(attrs.evolve(self.draft, transport=_set(self.draft.transport, provider=provider,
                                                               same_host_copy=same_host_copy)))

    @_names_the_call
    def speculative(self, method: SpecMethod, num_tokens: int | None = None) -> Cluster:
        """Speculative decoding on the decode instances: ``"mtp"``, ``"ngram"`` or ``"none"``, with
        ``num_tokens`` drafts per step (1..4)."""
        spec = _set(self.draft.speculative, method=method, num_tokens=num_tokens)
        return Cluster(attrs.evolve(self.draft, speculative=spec))

    @_names_the_call
    def serve(self, host: str | None = None, port: int | None = None, routing: Routing | None = None,
              access_log: bool | None = None, otlp_traces_endpoint: str | None = None) -> Cluster:
        """Where the OpenAI-compatible endpoint listens, how it picks a decode unit per request
        (``routing``: ``"cache_aware"`` or ``"least_loaded"``, see `Serve.routing`), whether it writes
        a line per finished request (``access_log``, see `Serve.access_log`), and where it sends each
        request's OpenTelemetry spans (``otlp_traces_endpoint``, an OTLP/HTTP URL; docs/tracing.md)."""
        serve = _set(self.draft.serve, host=host, port=port, routing=routing, access_log=access_log,
                     otlp_traces_endpoint=otlp_traces_endpoint)
        return Cluster(attrs.evolve(self.draft, serve=serve))

    @_names_the_call
    def on_ray(self, address: str | None = None) -> Cluster:
        """Run the units as Ray actors on a cluster's nodes (``address``: ``"auto"``, ``"HOST:PORT"``;
        None: a new one-node cluster), each instance in a placement group on the node the plan says."""
        return Cluster(attrs.evolve(self.draft, launch=_set(self.draft.launch, backend="ray", address=address)))

    # results
    @property
    def spec(self) -> Spec:
        """The finished spec, cross-checked against the model. Whether its ranks fit their memory is the
        plan's to say (`plan()` shows it; `launch()` and `disaggsdk validate` refuse what does not fit).

        Raises:
            SpecError: listing every problem, each with its spec path and the builder call that fixes it.
        """
        try:
            return check_spec(self.draft)
        except SpecError as exc:
            raise SpecError([with_builder_hint(p) for p in exc.problems]) from None

    def to_yaml(self) -> str:
        """The spec as YAML, loadable by `Cluster.from_yaml` and ``disaggsdk launch``."""
        return spec_to_yaml(self.spec)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Cluster:
        """A builder starting from a spec file (validated)."""
        return cls(load_spec(path))

    def plan(self) -> Plan:
        """The sharding / placement / transfer plan (renders as a table, HTML in Jupyter)."""
        from disaggsdk.plan import make_plan

        return make_plan(self.spec)

    def launch(self, **options: Any) -> Deployment:
        """Start this deployment (on this machine, or on Ray after `on_ray`) behind an OpenAI-compatible server.

        Start-up progress (each unit's loading, compiling, ready) and the endpoint's ready line print to
        stdout, unless ``on_progress`` takes the lines; in a notebook they share one output, redrawn with
        the latest two, which ends as the ready lines (`report.startup_status`).

        Args:
            options: `disaggsdk.face.deployment.launch` options (``tiny``, ``colocated``,
                ``port`` -- 0 picks a free one --, ``api_key``, ``on_progress``...).
        Returns:
            a running `Deployment` (a context manager; ``shutdown()`` stops every process).
        Raises:
            SpecError, UnitCannotRun: the spec cannot run here (the message says what instead; a spec
                problem with the builder call that fixes it).
        """
        import time

        from disaggsdk.face.deployment import launch
        from disaggsdk.report.startup_status import StartupStatus

        say: Callable[[str], None] = options.setdefault("on_progress", StartupStatus())
        start_s = time.monotonic()
        try:
            deployment = launch(self.spec, **options)
        except SpecError as exc:  # the plan's memory rules: checked only now, and as much the builder's to fix
            raise SpecError([with_builder_hint(p) for p in exc.problems]) from None
        say(f"ready in {time.monotonic() - start_s:.1f} s: {deployment.url}/v1  model {deployment.model_name}")
        return deployment

    def compare(self, trace: str | Path, slo: str | dict[str, float], *, num_prompts: int = 40, search_steps: int = 4,
                repeat: int = 1, goodput_target: float = 0.9, only: Sequence[str] = (), seed: int = 0,
                local_prefill_tokens: int = 512, recalibrate: bool = False) -> LayoutComparison:
        """Should this deployment disaggregate, for this traffic? Each layout that fits this machine
        (colocated, each P:D, conditional) is launched and swept for its goodput on ``trace``, the
        simulator's figure beside it; a GPU spec's own layouts are then simulated at its scale.

        Args:
            trace: a JSON-lines trace or a shipped trace's name (``"code-assistant"``).
            slo: ``"ttft=1000,tpot=50"`` or ``{"ttft": 1000, "tpot": 50}`` (milliseconds).
            num_prompts: requests per measured run.
            search_steps: bisections of each layout's rate search, after its flat-out run.
            repeat: rounds of each measured sweep (the median is reported, with the rounds' range).
            goodput_target: the share of requests that must meet every SLO.
            only: measure only these layouts here, by name (``"P1:D1"``) or kind (``"colocated"``).
            seed: seeds the draws from the trace and the arrivals.
            local_prefill_tokens: conditional layouts compute prompts this short on decode.
            recalibrate: time this machine again (``cpu-local``) first.
        Returns:
            a `LayoutComparison`: a table, the plots and the recommendation in a notebook.
        Raises:
            DisaggError: a bad trace, SLO, spec or option.
        """
        from disaggsdk.bench.serve_bench import parse_slos
        from disaggsdk.face.compare import compare

        slos_ms = parse_slos(slo) if isinstance(slo, str) else dict(slo)
        spec = self.spec
        cpu = spec.device == "cpu"  # this machine's spec itself; there is no other scale to simulate
        return compare(trace, slos_ms, [] if cpu else [spec], machine=spec if cpu else None,
                       goodput_target=goodput_target, search_steps=search_steps, rounds=repeat,
                       num_prompts=num_prompts, seed=seed, local_prefill_tokens=local_prefill_tokens,
                       recalibrate=recalibrate, only=only, say=_print_progress)

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(spec_to_yaml(self.draft))}</pre>"
