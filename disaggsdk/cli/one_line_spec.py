"""`disaggsdk launch --model M --device cpu --decoders 2`: a deployment from flags, without YAML.

The flags build the same `Spec` a YAML file would (``--print-spec`` prints it as that YAML): a model,
a device, and the prefill and decode instances' tp, dp, ep and counts. Everything else keeps the
spec's defaults, except on ``--device cpu``, which takes `specs/tiny_local.yaml`'s CPU settings
(every rank a process on one node, float32 KV so tokens compare with transformers, shm transport).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from disaggsdk.errors import SpecError

if TYPE_CHECKING:
    from disaggsdk.spec.types import Spec

ROLE_FLAGS = (  # (flag, spec role, key, help)
    ("--prefill-tp", "prefill", "tp", "tensor-parallel ranks of each prefill instance"),
    ("--prefills", "prefill", "replicas", "prefill instances"),
    ("--decode-tp", "decode", "tp", "tensor-parallel ranks of each decode instance"),
    ("--decode-dp", "decode", "dp", "data-parallel attention ranks of each decode instance"),
    ("--decode-ep", "decode", "ep", "expert parallelism of each decode instance: 1 or tp * dp"),
    ("--decoders", "decode", "replicas", "decode instances"),
)


def add_one_line_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the flags that describe a deployment instead of a SPEC file."""
    group = parser.add_argument_group("a deployment without a spec file (instead of SPEC)")
    group.add_argument("--model", dest="one_line_model", default=None, metavar="MODEL",
                       help="catalog name (e.g. qwen3-coder-tiny, deepseek-r1) or checkpoint directory")
    group.add_argument("--device", dest="one_line_device", choices=("cpu", "cuda"), default=None,
                       help="where the ranks run (default: the spec's, cuda)")
    for flag, _role, _key, text in ROLE_FLAGS:
        group.add_argument(flag, dest=_dest(flag), type=int, default=None, metavar="N", help=text)
    group.add_argument("--print-spec", action="store_true",
                       help="print the spec (YAML) the flags, or SPEC, describe, with every other flag that sets a key "
                            "(--port, --host, --served-model-name, --tiny, ...) applied, and exit")


def _dest(flag: str) -> str:
    return "one_line_" + flag.removeprefix("--").replace("-", "_")


def spec_of_args(args: argparse.Namespace) -> Spec:
    """The spec to launch: ``args.target`` loaded, or the one the one-line flags describe.

    Raises:
        SpecError: both a SPEC and flags, neither, or a spec that does not validate (its message
            names the flag to change).
    """
    from disaggsdk.spec import load_spec

    flags = [flag for flag, *_ in ROLE_FLAGS if getattr(args, _dest(flag), None) is not None]
    model = getattr(args, "one_line_model", None)
    device = getattr(args, "one_line_device", None)
    if args.target:
        given = flags + (["--model"] if model else []) + (["--device"] if device else [])
        if given:
            raise SpecError(f"{args.target} is a spec and {', '.join(given)} describe{'s' if len(given) == 1 else ''} "
                            "another: give one of them")
        return load_spec(args.target)
    if model is None:
        raise SpecError("give a SPEC file, or a deployment as flags: --model MODEL [--device cpu] [--decoders N] ...")
    return spec_from_flags(model, device, {flag: getattr(args, _dest(flag)) for flag in flags})


def spec_from_flags(model: str, device: str | None, role_flags: dict[str, int]) -> Spec:
    """The spec of ``model`` on ``device`` with ``role_flags`` ({"--decoders": 2, ...}) set.

    Raises:
        SpecError: the combination does not validate; the message names the flags.
    """
    from disaggsdk.spec import spec_from_dict
    from disaggsdk.spec.rules import check_spec

    data: dict[str, object] = {"model": model}
    roles: dict[str, dict[str, int]] = {"prefill": {}, "decode": {}}
    for flag, role, key, _text in ROLE_FLAGS:
        if flag in role_flags:
            roles[role][key] = role_flags[flag]
    data.update({role: values for role, values in roles.items() if values})
    if device is not None:
        data["device"] = device
    if device == "cpu":
        data.update(hardware={"gpu": "cpu", "nics_per_node": 1, "nic_gbps": 100}, kv={"dtype": "float32"},
                    transport={"provider": "shm"})
    try:
        return check_spec(spec_from_dict(data))  # the model's rules too: each problem then names its flag
    except SpecError as exc:  # the problems name YAML paths: say which flag each one is
        keys = {f"$.{role}.{key}": flag for flag, role, key, _ in ROLE_FLAGS}
        keys.update({"$.model": "--model", "$.device": "--device"})
        problems = []
        for problem in exc.problems:
            for key, flag in keys.items():
                problem = problem.replace(key + ":", f"{flag} ({key}):")
            problems.append(problem)
        raise SpecError(problems) from None
