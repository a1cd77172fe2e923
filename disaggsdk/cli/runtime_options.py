"""``--backend local|ray`` and ``--address``: where a spec's units run, on every command that
starts a spec (launch, bench SPEC, generate --spec). They override the spec's ``launch`` section."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disaggsdk.spec.types import Spec


def add_runtime_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, with_backend: bool = True) -> None:
    """Add ``--backend`` and ``--address`` to ``parser`` (or an argument group); ``with_backend``
    False where the load options' ``--backend`` already takes ``local | ray`` beside vLLM's values."""
    if with_backend:
        parser.add_argument("--backend", choices=("local", "ray"), default=None,
                            help="where the units run: local processes or Ray actors (default: the spec's "
                                 "launch.backend)")
    parser.add_argument("--address", default=None, metavar="auto|HOST:PORT",
                        help="the Ray cluster to join (implies --backend ray; default: the spec's launch.address, "
                             "else a new one-node cluster)")


def with_runtime_options(spec: Spec, args: argparse.Namespace) -> Spec:
    """``spec`` with its ``launch`` section overridden by ``--backend`` / ``--address`` where given."""
    import attrs

    backend, address = getattr(args, "backend", None), getattr(args, "address", None)
    backend = backend if backend in ("local", "ray") else None  # not vLLM's client backends
    if backend is None and address is None:
        return spec
    backend = backend or ("ray" if address else spec.launch.backend)
    address = address if address is not None else (spec.launch.address if backend == "ray" else None)
    return attrs.evolve(spec, launch=attrs.evolve(spec.launch, backend=backend, address=address))
