"""Names and addresses of a testbed's parts, derived from the testbed's name and a node's index.

Every name a testbed creates starts with ``dsk-NAME-`` (namespaces) or lives inside a namespace of
its own (interfaces, addresses), so `down` can find the leftovers of a half-built testbed from the
name alone, and nothing is ever created in the host's network namespace. Addresses come from
198.18.0.0/15, the range RFC 2544 reserves for benchmarks: node ``k`` is 198.18.0.(10+k)/24, so
one testbed holds at most 245 nodes.
"""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_NAME = "testbed"
STATE_DIR = Path("/run/disaggsdk-testbed")
SUBNET_PREFIX = "198.18.0."
SUBNET_PREFIX_LEN = 24
FIRST_HOST_OCTET = 10
MAX_NODES = 254 - FIRST_HOST_OCTET + 1  # 198.18.0.10 .. 198.18.0.254
NODE_INTERFACE = "eth0"  # the node's end of its veth, inside the node's namespace
BRIDGE = "br0"  # inside the switch namespace
NAMESPACE_PREFIX = "dsk-"
# a namespace name becomes a file in /run/netns and a hostname: keep it short and plain
_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,15}$")


def check_name(name: str) -> str:
    """``name`` if it can name a testbed, else ValueError with the rule.

    Raises:
        ValueError: not 1-16 lower-case letters and digits starting with a letter.
    """
    if not _NAME_PATTERN.match(name):
        raise ValueError(f"testbed name {name!r}: use 1-16 lower-case letters and digits, starting with a letter")
    return name


def namespace_prefix(name: str) -> str:
    """The prefix of every network namespace of testbed ``name`` (``dsk-NAME-``)."""
    return f"{NAMESPACE_PREFIX}{name}-"


def switch_namespace(name: str) -> str:
    """The namespace that holds the bridge every node's link plugs into."""
    return f"{namespace_prefix(name)}sw"


def node_name(name: str, index: int) -> str:
    """Node ``index``'s name, also its hostname: ``NAME-nINDEX``."""
    return f"{name}-n{index}"


def node_namespace(name: str, index: int) -> str:
    """Node ``index``'s network namespace: ``dsk-NAME-nINDEX``."""
    return f"{namespace_prefix(name)}n{index}"


def switch_port(index: int) -> str:
    """The switch-side end of node ``index``'s veth, inside the switch namespace."""
    return f"veth{index}"


def node_address(index: int) -> str:
    """Node ``index``'s IPv4 address (no prefix length): 198.18.0.(10+index).

    Raises:
        ValueError: ``index`` is beyond the /24 (more than `MAX_NODES` nodes).
    """
    if not 0 <= index < MAX_NODES:
        raise ValueError(f"node index {index}: a testbed holds nodes 0..{MAX_NODES - 1}")
    return f"{SUBNET_PREFIX}{FIRST_HOST_OCTET + index}"


def state_path(name: str, state_dir: Path = STATE_DIR) -> Path:
    """The JSON file that records testbed ``name`` for `status` and `down` in other processes."""
    return state_dir / f"{name}.json"
