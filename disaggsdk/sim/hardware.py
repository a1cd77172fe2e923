"""Hardware profiles: the numbers a cost model needs about one kind of node, read from data files.

Profiles live in ``disaggsdk/sim/profiles/*.yaml`` (h100, h200 from datasheets, cpu-local from
`disaggsdk calibrate`); each carries its sources. A user may pass a path to their own file.
"""

from __future__ import annotations

import os
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import attrs
import yaml

from disaggsdk.errors import SpecError, printable
from disaggsdk.sim.kernel_db import KernelDbRef, kernel_db_ref


@attrs.frozen
class HardwareProfile:
    """Rates of one device (a GPU, or one CPU rank) and of its node's links."""

    name: str
    hbm_gb_per_s: float  # memory bandwidth of one device, GB/s
    bf16_tflops: float  # dense peak of one device
    fp8_tflops: float
    nvlink_gb_per_s: float  # per device, per direction
    nics_per_node: int
    nic_gbps: float  # per NIC, Gbit/s
    memory_gb: float = 80.0
    flops_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.75
    nvlink_efficiency: float = 0.7
    allreduce_latency_us: float = 8.0
    step_overhead_ms: float = 2.0
    kernel_overhead_us_per_layer: float = 25.0
    transfer_write_overhead_us: float = 2.0
    # serving stack (fitted by `disaggsdk calibrate --deployment`; 0 for datasheet profiles):
    request_overhead_ms: float = 0.0  # front end + routing, before a request reaches an instance
    handoff_overhead_ms: float = 0.0  # disaggregated only: control messages, polling, admission
    # disaggregated only: what a unit's loop adds to each step when it also runs a KV messenger
    # (frames, counter events, transfer polling) -- colocated units do not pay it
    messenger_step_overhead_ms: float = 0.0
    # CPU machines, where everything shares the cores (measured by `disaggsdk calibrate
    # --deployment` from the processes' CPU time; 0 for datasheet profiles, whose front end and
    # clients run elsewhere): CPU time the server (router + HTTP front end) and a benchmark client
    # spend per output token and per request, and the cores an idle unit burns polling
    frontend_cpu_ms_per_token: float = 0.0
    frontend_cpu_ms_per_request: float = 0.0
    client_cpu_ms_per_token: float = 0.0
    client_cpu_ms_per_request: float = 0.0
    idle_unit_cores: float = 0.0  # a colocated (mixed) unit
    idle_messenger_unit_cores: float = 0.0  # a prefill or decode unit, whose messenger polls too
    # the machine's speed the fit holds for: `SpeedMonitor` medians during calibration's engine
    # timing (0: not recorded), so that `disaggsdk.calibrate.speed_monitor.retimed` can follow a drifting VM
    monitor_prefill_cpu_ms: float = 0.0
    monitor_decode_step_cpu_ms: float = 0.0
    # the measured kernel tables of this GPU (`disaggsdk.sim.kernel_db`): what `layered_kernels.kernel_costs_for`
    # reads before the roofline of the rates above; None (CPU profiles): the roofline alone
    kernel_db: KernelDbRef | None = attrs.field(default=None, converter=kernel_db_ref)
    sources: dict[str, str] = attrs.field(factory=dict, eq=False)

    def tflops(self, weight_dtype: str) -> float:
        """Dense peak for matrix work in ``weight_dtype`` (fp8 or a 16/32-bit type)."""
        return self.fp8_tflops if weight_dtype == "fp8" else self.bf16_tflops

    @property
    def nic_bytes_per_s(self) -> float:
        return self.nic_gbps * 1e9 / 8

    def slowed_by(self, factor: float, matrix_factor: float | None = None) -> HardwareProfile:
        """The same machine running ``factor`` times slower (< 1: faster): every rate divided by it,
        every time and every CPU cost multiplied by it, the matrix rate by ``matrix_factor`` when
        given (matrix work and interpreter overhead need not slow down alike). Used to re-time a
        calibrated profile to the speed probed at another minute of a drifting VM.

        Raises:
            ValueError: a factor is not a positive number.
        """
        matrix_factor = factor if matrix_factor is None else matrix_factor
        if not (factor > 0 and matrix_factor > 0):
            raise ValueError(f"speed factors must be positive, got {factor} and {matrix_factor}")
        rates = ("hbm_gb_per_s", "nvlink_gb_per_s", "nic_gbps")
        times = ("allreduce_latency_us", "step_overhead_ms", "kernel_overhead_us_per_layer",
                 "transfer_write_overhead_us", "request_overhead_ms", "handoff_overhead_ms",
                 "messenger_step_overhead_ms", "frontend_cpu_ms_per_token", "frontend_cpu_ms_per_request",
                 "client_cpu_ms_per_token", "client_cpu_ms_per_request", "idle_unit_cores",
                 "idle_messenger_unit_cores", "monitor_decode_step_cpu_ms")
        changes = {f: getattr(self, f) / factor for f in rates} | {f: getattr(self, f) * factor for f in times}
        changes |= {"bf16_tflops": self.bf16_tflops / matrix_factor, "fp8_tflops": self.fp8_tflops / matrix_factor,
                    "monitor_prefill_cpu_ms": self.monitor_prefill_cpu_ms * matrix_factor}
        return attrs.evolve(self, **changes)


def user_profile_dir() -> Path:
    """Where calibrated profiles live: ``$DISAGGSDK_HOME/profiles`` (default ~/.cache/disaggsdk)."""
    home = os.environ.get("DISAGGSDK_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "disaggsdk")
    return Path(home) / "profiles"


def _user_profile_path(name: str) -> Path:
    return user_profile_dir() / f"{name}.yaml"


def profile_names() -> list[str]:
    """Profiles shipped with disaggsdk, then calibrated ones in the user's profile folder."""

    folder = resources.files("disaggsdk.sim") / "profiles"
    shipped = sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
    mine = sorted(p.stem for p in user_profile_dir().glob("*.yaml")) if user_profile_dir().is_dir() else []
    return shipped + [m for m in mine if m not in shipped]


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A shipped profile by name (``h200``) or a profile file by path.

    Raises:
        SpecError: unknown name, unreadable file, or a field missing / of the wrong kind.
    """
    path = Path(name_or_path)
    text_source: Path | Traversable  # a file, or a profile shipped in the package
    # os.path's tests, not Path's: they answer False for a name too long to be a path (Python 3.11's raise)
    if path.suffix in (".yaml", ".yml") or os.path.exists(path):
        text_source = path
    elif os.path.isfile(_user_profile_path(str(name_or_path))):
        text_source = _user_profile_path(str(name_or_path))
    else:
        hint = " (run `disaggsdk calibrate` to measure this machine)" if str(name_or_path) == "cpu-local" else ""
        if str(name_or_path) not in profile_names():
            raise SpecError(f"unknown hardware profile {str(name_or_path)!r}{hint}; use one of "
                            f"{', '.join(profile_names())} or a path to a profile YAML file")
        text_source = resources.files("disaggsdk.sim") / "profiles" / f"{name_or_path}.yaml"
    try:
        data = yaml.safe_load(text_source.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else " ".join(str(exc).split())  # one line
        raise SpecError(f"{printable(str(name_or_path))}: cannot read hardware profile: {why}") from None
    known = {f.name for f in attrs.fields(HardwareProfile)}
    unknown = set(data or {}) - known
    if unknown:
        raise SpecError(f"{name_or_path}: unknown profile fields {sorted(unknown)}; valid: {sorted(known)}")
    try:
        return HardwareProfile(**data)
    except (TypeError, SpecError) as exc:
        raise SpecError(f"{name_or_path}: {exc}") from None
