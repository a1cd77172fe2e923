"""Where aiconfigurator-core's measured kernel tables lie, which of them a profile means, and reading them.

NVIDIA's aiconfigurator-core (Apache-2.0, the ``kernels`` extra) ships kernel latencies measured on each
GPU under each serving framework and version, as parquet files::

    aiconfigurator_core/systems/data/<system>/<family>/<framework>/<version>/<table>.parquet
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import attrs
import yaml

from disaggsdk.errors import DisaggError, SpecError

if TYPE_CHECKING:
    from disaggsdk.sim.grid_interp import Cell

PACKAGE = "aiconfigurator_core"  # the import name; the distribution is aiconfigurator-core
DISTRIBUTION = "aiconfigurator-core"
INSTALL_HINT = "pip install 'disaggsdk[kernels]'"
FRAMEWORKS = ("sglang", "vllm", "trtllm")
NCCL = "nccl"  # the framework-free directory of NCCL's collectives
# our GPU names -> the package's system directories (a name already spelled the package's way is kept)
SYSTEMS: Mapping[str, str] = {
    "a100": "a100_sxm", "h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "b300": "b300_sxm",
}


class KernelDbUnavailable(DisaggError):
    """The kernel tables cannot be read (the package is missing, or has no tables for this GPU); the
    message is one line, ending with what a simulation does instead."""


def version_key(version: str) -> tuple[tuple[int, ...], int, int] | None:
    """An ordering key of a framework version (``0.5.6.post2`` < ``0.5.14``; ``1.3.0rc20`` < ``1.3.0``);
    None for a directory name that is no version."""
    match = re.fullmatch(r"(\d+(?:\.\d+)*)(?:\.?(dev|rc|post)(\d+))?", version)
    if match is None:
        return None
    tag = {"dev": -2, "rc": -1, None: 0, "post": 1}[match[2]]
    return tuple(int(x) for x in match[1].split(".")), tag, int(match[3] or 0)


@attrs.frozen
class KernelDbRef:
    """Which measured tables a profile's kernels come from (the ``kernel_db`` key of a profile YAML)."""

    system: str  # our GPU name (h200) or the package's system directory (h200_sxm)
    framework: str = attrs.field(validator=attrs.validators.in_(FRAMEWORKS))
    version: str  # the framework's version the tables were collected under, e.g. "0.5.14"
    # the framework prepares step N+1 on the CPU while step N's kernels run, as each does by default:
    # SGLang's overlap schedule (unless --disable-overlap-schedule), vLLM's async scheduling (default
    # since 0.12, vllm-project/vllm#27614), TensorRT-LLM's overlap scheduler (PyTorch flow)
    overlap_scheduler: bool = True

    @property
    def package_system(self) -> str:
        """The package's name of the GPU: its directory under ``systems/data``."""
        return SYSTEMS.get(self.system, self.system)

    def __str__(self) -> str:
        return f"{self.package_system} {self.framework} {self.version}"

    @classmethod
    def from_option(cls, text: str, system: str) -> KernelDbRef | None:
        """A ``--kernels`` value: ``FRAMEWORK@VERSION`` (``sglang@0.5.14``) on ``system``, or ``roofline`` (None).

        Raises:
            SpecError: any other form, or an unknown framework.
        """
        if text == "roofline":
            return None
        framework, at, version = text.partition("@")
        if not at or framework not in FRAMEWORKS or not version:
            raise SpecError(f"--kernels {text!r}: use FRAMEWORK@VERSION with a framework of {', '.join(FRAMEWORKS)} "
                            f"(e.g. sglang@0.5.14), or roofline")
        return cls(system, framework, version)


def kernel_db_ref(value: KernelDbRef | Mapping[str, object] | None) -> KernelDbRef | None:
    """The converter of `HardwareProfile.kernel_db`: a profile YAML's mapping (or None) as a `KernelDbRef`.

    Raises:
        SpecError: a key other than system, framework, version and overlap_scheduler, one of the first three
            missing, or an unknown framework.
    """
    if value is None or isinstance(value, KernelDbRef):
        return value
    required = {"system", "framework", "version"}
    allowed = required | {"overlap_scheduler"}
    if not isinstance(value, Mapping) or not required <= set(value) <= allowed:
        given = sorted(value) if isinstance(value, Mapping) else value
        raise SpecError(f"kernel_db: give {sorted(required)} and optionally overlap_scheduler (e.g. system: h200, "
                        f"framework: sglang, version: '0.5.14'), got {given}")
    overlap = value.get("overlap_scheduler", True)
    if not isinstance(overlap, bool):
        raise SpecError(f"kernel_db.overlap_scheduler: give true or false, got {overlap!r}")
    try:
        return KernelDbRef(str(value["system"]), str(value["framework"]), str(value["version"]), overlap)
    except ValueError:
        raise SpecError(f"kernel_db.framework: {value['framework']!r} is not one of {', '.join(FRAMEWORKS)}") from None


@attrs.frozen
class TableFile:
    """One measured table: ``<system>/<family>/<framework>/<version>/<table>.parquet``."""

    family: str  # gemm, attention, mla, mla_bmm, moe, comm
    framework: str  # sglang | vllm | trtllm | nccl
    version: str
    table: str  # the file's stem: gemm_perf, context_attention_perf, ...


class KernelDb:
    """The measured tables of one GPU under one framework and version (`KernelDbRef`), read on first use."""

    def __init__(self, ref: KernelDbRef, data_root: Path, package_version: str) -> None:
        """Prefer `KernelDb.open`, which finds the installed package.

        Raises:
            KernelDbUnavailable: ``data_root`` has no tables for the system.
        """
        self.ref = ref
        self.data_root = data_root
        self.package_version = package_version
        self.system_dir = data_root / ref.package_system
        if not self.system_dir.is_dir() or not any(self.system_dir.glob("*/*/*/*.parquet")):
            known = sorted(p.name for p in data_root.iterdir() if p.is_dir() and any(p.glob("*/*/*/*.parquet")))
            raise KernelDbUnavailable(f"{DISTRIBUTION} {package_version} has no kernel tables for {ref.package_system} "
                                      f"(it has {', '.join(known)}); using the roofline for every kernel")
        self._rows: dict[tuple[Path, tuple[str, ...]], dict[str, list[Cell]] | None] = {}
        self._status: dict[Path, Mapping[str, object]] = {}
        self._versions: dict[tuple[str, str, str], list[TableFile]] = {}

    @classmethod
    def open(cls, ref: KernelDbRef, data_root: Path | None = None) -> KernelDb:
        """The installed package's tables for ``ref`` (``data_root``: another copy of ``systems/data``, for tests).

        Raises:
            KernelDbUnavailable: aiconfigurator-core or pyarrow is not installed, or has no tables for the GPU.
        """
        if data_root is None:
            spec = importlib.util.find_spec(PACKAGE)
            if spec is None or spec.origin is None or importlib.util.find_spec("pyarrow") is None:
                raise KernelDbUnavailable(f"kernel tables need {INSTALL_HINT}; using the roofline for every kernel")
            data_root = Path(spec.origin).parent / "systems" / "data"
        try:
            package_version = importlib.metadata.version(DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            package_version = "(unknown version)"
        return cls(ref, data_root, package_version)

    def _framework_versions(self, family: str, framework: str, table: str) -> list[str]:
        folder = self.system_dir / family / framework
        found = [d.name for d in folder.iterdir() if (d / f"{table}.parquet").is_file()] if folder.is_dir() else []
        keyed = [(key, v) for v in found if (key := version_key(v)) is not None]
        return [v for _, v in sorted(keyed, reverse=True)]

    def _nccl_version(self) -> str | None:
        # the system YAML's misc.nccl_version: the NCCL its framework measurements ran with
        try:
            facts = yaml.safe_load((self.data_root.parent / f"{self.ref.package_system}.yaml").read_text())
            return str(facts["misc"]["nccl_version"])
        except (OSError, yaml.YAMLError, KeyError, TypeError):
            return None

    def versions(self, family: str, table: str, framework: str | None = None) -> list[TableFile]:
        """The directories that may answer for ``table``, in the order to ask them (module doc).

        Args:
            family: the table's family directory (gemm, attention, mla, mla_bmm, moe, comm).
            table: the file's stem.
            framework: the framework directory; None: the profile's. `NCCL` for NCCL's own tables.
        """
        framework = framework or self.ref.framework
        key = (family, table, framework)
        if key not in self._versions:
            self._versions[key] = self._ordered_versions(family, table, framework)
        return self._versions[key]

    def _ordered_versions(self, family: str, table: str, framework: str) -> list[TableFile]:
        found = self._framework_versions(family, framework, table)
        if framework == NCCL:
            system_nccl = self._nccl_version()
            limit = version_key(system_nccl) if system_nccl else None
        else:
            limit = version_key(self.ref.version)
        if limit is not None:
            found = [v for v in found if (key := version_key(v)) is not None and key <= limit]
        return [TableFile(family, framework, v, table) for v in found]

    def path(self, file: TableFile) -> Path:
        return self.system_dir / file.family / file.framework / file.version / f"{file.table}.parquet"

    def read(self, file: TableFile, columns: Sequence[str]) -> dict[str, list[Cell]] | None:
        """``columns`` of ``file`` as lists (pyarrow, imported here on the first read); None when the file
        lacks one of them (an older directory's table may have another schema)."""
        key = (self.path(file), tuple(columns))
        if key not in self._rows:
            import pyarrow.parquet as pq  # the kernels extra; only here, only now

            path = self.path(file)
            if not set(columns) <= set(pq.read_schema(path).names):
                self._rows[key] = None
            else:
                self._rows[key] = cast("dict[str, list[Cell]]", pq.read_table(path, columns=list(columns)).to_pydict())
        return self._rows[key]

    def status(self, file: TableFile) -> str:
        """The table's collection status from its ``collection_meta.yaml``: complete, partial, or unknown."""
        meta_path = self.path(file).parent / "collection_meta.yaml"
        if meta_path not in self._status:
            try:
                self._status[meta_path] = yaml.safe_load(meta_path.read_text()) or {}
            except (OSError, yaml.YAMLError):
                self._status[meta_path] = {}
        tables = self._status[meta_path].get("tables")
        entry = tables.get(file.table) if isinstance(tables, Mapping) else None
        status = entry.get("status") if isinstance(entry, Mapping) else None
        return str(status) if status else "unknown"

    def describe(self, file: TableFile) -> str:
        """The table as a figure's source names it: package, version and path (and "partial" if so collected)."""
        relative = self.path(file).relative_to(self.data_root)
        partial = ", collected partially" if self.status(file) == "partial" else ""
        return f"{DISTRIBUTION} {self.package_version} {relative}{partial}"
