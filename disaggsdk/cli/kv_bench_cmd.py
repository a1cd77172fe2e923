"""`disaggsdk kv-bench`: exposed KV transfer time with layer streaming vs. the ablation, as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from disaggsdk.cli.options import add_hidden_alias
from disaggsdk.spec.kv import KV_DTYPES

if TYPE_CHECKING:
    from disaggsdk.spec.types import Spec

HELP = "Measure the exposed KV transfer time, layer-streamed vs. sent after the forward pass (JSON)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of `kv-bench`."""
    parser.add_argument("spec", help="deployment spec (YAML)")
    parser.add_argument("--tiny", action="store_true", help="a GPU spec's topology with its tiny model, on CPU")
    parser.add_argument("--input-len", type=int, default=1024, help="tokens per prompt")
    add_hidden_alias(parser, "--prompt-len", dest="input_len", type=int)
    parser.add_argument("--num-prompts", type=int, default=8, help="measured requests per mode (one at a time)")
    add_hidden_alias(parser, "--requests", dest="num_prompts", type=int)
    parser.add_argument("--provider", default=None, help="libfabric provider overriding the spec (shm, tcp)")
    parser.add_argument("--pin", action="store_true", help="pin each unit to one core (round robin)")
    parser.add_argument("--no-same-host-copy", action="store_true",
                        help="shm: every byte through libfabric (transport.same_host_copy: false)")
    parser.add_argument("--kv-dtype", choices=KV_DTYPES, default=None,
                        help="KV element type overriding the spec's kv.dtype (after --tiny, which sets float32)")


def bench_spec(args: argparse.Namespace) -> Spec:
    """The spec the bench runs: the file's, with --tiny, --no-same-host-copy and --kv-dtype applied
    in that order (so --kv-dtype wins over --tiny's float32 KV).

    Raises:
        DisaggError: the spec cannot be loaded, or has no tiny variant under --tiny.
    """
    import attrs

    from disaggsdk.launch.tiny import tiny_spec
    from disaggsdk.spec import load_spec

    spec = load_spec(args.spec)
    if args.tiny:
        spec = tiny_spec(spec)
    if args.no_same_host_copy:
        spec = attrs.evolve(spec, transport=attrs.evolve(spec.transport, same_host_copy=False))
    if args.kv_dtype is not None:
        spec = attrs.evolve(spec, kv=attrs.evolve(spec.kv, dtype=args.kv_dtype))
    return spec


def run(args: argparse.Namespace) -> int:
    """Run both modes and print one JSON document.

    Returns:
        0.
    Raises:
        DisaggError: the spec cannot be loaded or started.
    """
    from disaggsdk.bench.kv_bench import compare

    result = compare(bench_spec(args), args.input_len, args.num_prompts, provider=args.provider,
                     cpu_affinity="auto" if args.pin else None)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
