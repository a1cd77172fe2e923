"""The cuMem pool code (kv/pools/cuda_vmm.py, kv/pools/rank_pool.py) against the installed cuda-python,
without a GPU: run as ``python -m tests.gpu_api.cuda_driver_calls``, it prints a JSON report.

cuda-python's driver functions are Cython: ``inspect`` cannot read their signatures and the package
ships no ``.pyi`` for them (their docstrings' first lines give the C signature). But each converts and
type-checks its arguments (C integer types, the struct and handle classes, lists of descriptors)
before it loads the driver library. So `DriverStandIn` calls the real function with the project's
exact arguments in a process where loading libcuda fails on purpose (`DriverBlocked`): any other
error is the binding refusing the arguments, a mismatch; the blocked load means it accepted them.
The call is then answered as the function's docstring says it returns (its "Returns" section: a
CUresult, then each value's type) with objects of those real types (a CUdevice, a CUdeviceptr, ...),
which later calls convert in turn.

A fresh process of its own: on a GPU machine a process that already loaded the driver would run
these calls for real.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import re
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import cuda.bindings
from cuda.bindings import driver as real_driver

# cuda-bindings 13 loads libcuda through this module, which `main` blocks; 12.9 (CUDA 12 builds of
# torch pin it) dlopens libcuda.so.1 from C, which only a machine without a driver refuses
DRIVER_LOADER_MODULE = "cuda.bindings._internal.driver"
DLOPEN_FAILED = "Failed to dlopen"  # cuda-bindings 12.9's RuntimeError where libcuda is missing

ROOT = Path(__file__).resolve().parents[2]
GRANULARITY_BYTES = 2 << 20  # what the stand-in says cuMemGetAllocationGranularity returns
STAND_IN_ERROR_TEXT = b"CUDA_ERROR_STAND_IN"


class DriverBlocked(RuntimeError):
    """Raised where cuda-python loads libcuda: the binding has converted the call's arguments."""


def _blocked_load(*args: object, **kwargs: object) -> object:
    raise DriverBlocked("the stand-in blocks loading the driver")


def documented_results(function: Callable[..., object]) -> list[tuple[str, str]]:
    """(name, type) of each value after the CUresult that ``function``'s docstring says it returns.

    Raises:
        ValueError: the docstring has no Returns section starting with CUresult.
    """
    doc = function.__doc__ or ""
    section = doc.partition("Returns\n-------\n")[2].split("\nSee Also")[0]
    entries = [line for line in section.splitlines() if line and not line.startswith(" ")]
    if not entries or entries[0] != "CUresult":
        raise ValueError(f"{function.__name__}: no 'Returns' section starting with CUresult in its docstring")
    results = []
    for entry in entries[1:]:
        name, _, type_text = entry.partition(" : ")
        results.append((name.strip(), type_text.strip()))
    return results


def stand_in_value(function_name: str, name: str, type_text: str) -> object:
    """An object of the documented type for a returned value (a real cuda-python type where it names one).

    Raises:
        NotImplementedError: a type this stand-in has no value for.
    """
    named = re.fullmatch(r":py:obj:`~\.(\w+)`", type_text)
    if named:
        return getattr(real_driver, named.group(1))(1)
    if type_text == "int":
        return GRANULARITY_BYTES
    if type_text == "bytes":
        return STAND_IN_ERROR_TEXT
    if (function_name, name) == ("cuMemExportToShareableHandle", "shareableHandle"):
        return os.memfd_create("stand-in-cumem")  # a POSIX-fd handle: an fd the caller owns and closes
    raise NotImplementedError(f"{function_name}: no stand-in value for {name} : {type_text}")


class DriverStandIn:
    """``cuda.bindings.driver`` as the project's code sees it (module docstring).

    Attributes:
        calls: the driver functions called, in order.
        mismatches: each call the real binding refused, with its error.
        failures: function name -> the CUresult it answers with instead of CUDA_SUCCESS.
    """

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.mismatches: list[str] = []
        self.failures: dict[str, object] = {}

    def __getattr__(self, name: str) -> object:
        value = getattr(real_driver, name)  # AttributeError: the installed cuda-python lacks it
        if isinstance(value, type) or not callable(value):
            return value  # the real structs, handles and enums

        def call(*args: object, **kwargs: object) -> tuple[object, ...]:
            self.calls.append(name)
            try:
                value(*args, **kwargs)
            except DriverBlocked:
                pass
            except RuntimeError as exc:
                if not str(exc).startswith(DLOPEN_FAILED):
                    self.mismatches.append(f"{name}: RuntimeError: {exc}")
                    raise
            except Exception as exc:  # whatever the binding raises (re-raised) is the mismatch to report
                self.mismatches.append(f"{name}({', '.join(map(repr, args))}): {type(exc).__name__}: {exc}; "
                                       f"the installed binding is {(value.__doc__ or '').splitlines()[0]}")
                raise
            else:
                raise AssertionError(f"{name} ran in a real driver: this process must not have loaded libcuda")
            results = documented_results(value)
            failure = self.failures.get(name)
            if failure is not None:
                return (failure, *(None for _ in results))
            return (real_driver.CUresult.CUDA_SUCCESS, *(stand_in_value(name, n, t) for n, t in results))

        return call


def _is_closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def scenarios(stand_in: DriverStandIn) -> Iterator[tuple[str, Callable[[], None]]]:
    """(name, run) of each path through the project's cuMem code."""
    from disaggsdk.kv.pools import create_rank_pool
    from disaggsdk.kv.pools.base import SharedMemoryError
    from disaggsdk.kv.pools.cuda_vmm import CudaSharedAllocation, CudaSharedMapping, load_driver
    from disaggsdk.kv.pools.rank_pool import recv_rank_pool, send_rank_pool

    def load() -> None:
        assert load_driver() is stand_in

    def create_and_close() -> None:
        allocation = CudaSharedAllocation.create(3 << 20, device=0)
        assert allocation.size_bytes == 2 * GRANULARITY_BYTES, "rounded up to the granularity"
        assert allocation.cuda_device == 0 and allocation.fd >= 0
        fd = allocation.fd
        allocation.close()
        assert _is_closed(fd) and allocation.fd == -1

    def import_and_close() -> None:
        fd = os.memfd_create("exported")
        mapping = CudaSharedMapping.import_fd(fd, 4 << 20, device=1)
        assert _is_closed(fd), "the imported handle holds its own reference"
        assert mapping.cuda_device == 1
        mapping.close()

    def create_fails_to_map() -> None:
        stand_in.failures = {"cuMemMap": real_driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY}
        before = len(stand_in.calls)
        try:
            CudaSharedAllocation.create(1 << 20, device=0)
        except SharedMemoryError as exc:
            assert "cuMemMap failed" in str(exc), exc
        else:
            raise AssertionError("a failed cuMemMap must raise")
        finally:
            stand_in.failures = {}
        cleanup = stand_in.calls[before:]
        assert {"cuGetErrorString", "cuMemUnmap", "cuMemAddressFree", "cuMemRelease"} <= set(cleanup), cleanup

    def import_fails() -> None:
        stand_in.failures = {"cuMemImportFromShareableHandle": real_driver.CUresult.CUDA_ERROR_INVALID_VALUE}
        fd = os.memfd_create("bad")
        try:
            CudaSharedMapping.import_fd(fd, 1 << 20)
        except SharedMemoryError as exc:
            assert "cuMemImportFromShareableHandle failed" in str(exc), exc
        else:
            raise AssertionError("a failed import must raise")
        finally:
            stand_in.failures = {}
        assert _is_closed(fd)

    def rank_pool_hand_over() -> None:
        pool = create_rank_pool(3 << 20, "cuda:0", "rank0")
        left, right = socket.socketpair(socket.AF_UNIX)
        with left, right:
            send_rank_pool(left, pool)
            received = recv_rank_pool(right)
        assert received.cuda_device == 0 and received.size_bytes == pool.size_bytes
        received.close()
        pool.close()

    yield from [("load_driver", load), ("create_and_close", create_and_close), ("import_and_close", import_and_close),
                ("create_fails_to_map", create_fails_to_map), ("import_fails", import_fails),
                ("rank_pool_hand_over", rank_pool_hand_over)]


def _refused_call(stand_in: DriverStandIn) -> str:
    """The stand-in's own check: a descriptor passed bare where the binding takes a list of them."""
    access = real_driver.CUmemAccessDesc()
    try:
        stand_in.cuMemSetAccess(0, 1 << 20, access, 1)  # type: ignore[operator]
    except TypeError:
        return "refused"
    return "accepted"


def driver_functions_in_source() -> list[str]:
    """Every ``cu*`` driver function the package's source calls (``<anything>.cuName(``)."""
    names: set[str] = set()
    for path in (ROOT / "disaggsdk").rglob("*.py"):
        names.update(re.findall(r"\.(cu[A-Z]\w*)\(", path.read_text()))
    return sorted(names)


def main() -> None:
    """Run every scenario against the stand-in and print the report as one JSON line.

    Raises:
        SystemExit: cuda-bindings 12 on a machine whose driver loads (its load cannot be blocked here).
    """
    if importlib.util.find_spec(DRIVER_LOADER_MODULE) is not None:
        importlib.import_module(DRIVER_LOADER_MODULE).load_nvidia_dynamic_lib = _blocked_load
    else:
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError:
            pass  # no driver: each call's dlopen fails after its arguments were converted
        else:
            raise SystemExit("cuda-bindings 12 on a machine with a CUDA driver: its load cannot be blocked, so "
                             "these calls would run for real; run this check with cuda-bindings 13 or without a driver")
    stand_in = DriverStandIn()
    cuda.bindings.driver = stand_in  # type: ignore[attr-defined]
    sys.modules["cuda.bindings.driver"] = stand_in  # type: ignore[assignment]
    self_check = _refused_call(stand_in)
    stand_in.calls.clear()  # the project's calls only, from here on
    stand_in.mismatches.clear()
    outcomes = {}
    for name, run in scenarios(stand_in):
        try:
            run()
            outcomes[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - every scenario's outcome goes into the report
            outcomes[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"self_check": self_check, "scenarios": outcomes, "calls": stand_in.calls,
                      "mismatches": stand_in.mismatches, "in_source": driver_functions_in_source()}))


if __name__ == "__main__":
    main()
