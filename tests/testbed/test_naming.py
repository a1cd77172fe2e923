"""Names and addresses derive from the testbed's name and a node's index; bad names are refused."""

from __future__ import annotations

import pytest

from disaggsdk.testbed.naming import (
    MAX_NODES,
    check_name,
    namespace_prefix,
    node_address,
    node_name,
    node_namespace,
    switch_namespace,
)


def test_parts_of_a_testbed_share_its_prefix():
    assert node_namespace("lab", 3).startswith(namespace_prefix("lab"))
    assert switch_namespace("lab").startswith(namespace_prefix("lab"))
    assert node_name("lab", 3) == "lab-n3"
    # one testbed's prefix never covers another's: names hold no '-'
    assert not node_namespace("lab2", 0).startswith(namespace_prefix("lab"))


def test_addresses_come_from_the_benchmark_range():
    assert node_address(0) == "198.18.0.10"
    assert node_address(MAX_NODES - 1) == "198.18.0.254"
    with pytest.raises(ValueError, match="a testbed holds nodes"):
        node_address(MAX_NODES)


@pytest.mark.parametrize("name", ["Lab", "lab-1", "1lab", "", "a" * 17, "lab x"])
def test_bad_names_are_refused(name):
    with pytest.raises(ValueError, match="lower-case letters and digits"):
        check_name(name)
    assert check_name("lab2") == "lab2"
