"""The YAML loader of spec files: PyYAML's safe loader with bounds a hostile file cannot get past."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.error import Mark
from yaml.nodes import MappingNode, Node, ScalarNode

# What a spec needs, with room: the shipped specs have at most 63 nodes (every key and value is one)
# nested 4 deep, and one with every key written out ~300.
MAX_NODES = 10_000
MAX_DEPTH = 32
MAX_ALIASES = 100
MAX_INTEGER_CHARS = 40  # 10^39 and more: past every bound a spec sets (its largest is 2^63)
MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlRefused(Exception):
    """A spec file the loader refuses to read on: too many aliases or nodes, too deep, a key twice.

    Attributes:
        mark: where in the file (PyYAML's 0-based line and column).
        problem: what is wrong and what to do, one line, quoting no value of the file but keys.
    """

    def __init__(self, mark: Mark, problem: str):
        self.mark = mark
        self.problem = problem
        super().__init__(problem)


class SpecLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that counts what it composes: nodes (aliases expanded), depth and aliases.

    Every node composed counts once, and an alias counts the nodes of the node it names, so the
    count is the size of the document once its aliases are expanded, known before anything is
    expanded. The open collections' heights are kept the same way, so an alias that would put a
    deep node deeper than `MAX_DEPTH` is refused too.
    """

    def __init__(self, stream: str):
        super().__init__(stream)
        self._num_nodes = 0
        self._num_aliases = 0
        self._open_heights: list[int] = []  # per open collection: the height of its tallest child so far
        self._anchored: dict[int, tuple[int, int]] = {}  # id(anchored node) -> (nodes expanded, height)

    def compose_node(self, parent: Node | None, index: object) -> Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            return self._compose_alias(parent, index, event)
        if len(self._open_heights) >= MAX_DEPTH:
            raise YamlRefused(event.start_mark, f"nested deeper than {MAX_DEPTH} levels; a spec nests 4 "
                                                "(serve.autoscale.ttft_ms): flatten it")
        before = self._num_nodes
        self._count(1, 1, event.start_mark)
        self._open_heights.append(0)
        node: Node = super().compose_node(parent, index)
        height = 1 + self._open_heights.pop()
        if event.anchor is not None:
            self._anchored[id(node)] = (self._num_nodes - before, height)
        self._note_child(height)
        return node

    def _compose_alias(self, parent: Node | None, index: object, event: yaml.AliasEvent) -> Node:
        self._num_aliases += 1
        if self._num_aliases > MAX_ALIASES:
            raise YamlRefused(event.start_mark, f"more than {MAX_ALIASES} aliases (*name); a spec needs a few: "
                                                "write the values out")
        target = self.anchors.get(event.anchor)
        if target is not None and id(target) not in self._anchored:  # still open: it would contain itself
            raise YamlRefused(event.start_mark, f"alias *{event.anchor} is inside the node it names (a structure "
                                                "that contains itself); write the value out")
        node: Node = super().compose_node(parent, index)  # PyYAML's error for an undefined alias
        num_nodes, height = self._anchored[id(node)]
        self._count(num_nodes, height, event.start_mark)
        self._note_child(height)
        return node

    def _count(self, num_nodes: int, height: int, mark: Mark) -> None:
        self._num_nodes += num_nodes
        if self._num_nodes > MAX_NODES:
            if self._num_aliases:
                raise YamlRefused(mark, f"the aliases expand the spec past {MAX_NODES:,} values and keys (a spec "
                                        "has a few hundred); write the values out instead of aliasing aliases")
            raise YamlRefused(mark, f"the spec has more than {MAX_NODES:,} values and keys; a spec has a few hundred")
        if len(self._open_heights) + height > MAX_DEPTH:
            raise YamlRefused(mark, f"nested deeper than {MAX_DEPTH} levels once its aliases are expanded; a spec "
                                    "nests 4 (serve.autoscale.ttft_ms): flatten it")

    def _note_child(self, height: int) -> None:
        if self._open_heights:
            self._open_heights[-1] = max(self._open_heights[-1], height)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[object, Mark] = {}
        for key_node, _value in node.value:
            if key_node.tag == MERGE_TAG:  # `<<: *base`: keys written beside it override the merged ones
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: PyYAML's own error names it
                continue
            if first is not key_node.start_mark:
                raise YamlRefused(key_node.start_mark, f"duplicate key {_key_text(key)} (first at line "
                                                       f"{first.line + 1}); YAML keeps only the last: write it once")
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping

    def construct_yaml_int(self, node: ScalarNode) -> int:
        text = node.value
        if isinstance(text, str) and len(text) > MAX_INTEGER_CHARS:
            raise YamlRefused(node.start_mark, f"an integer written with {len(text):,} characters; a spec's "
                                               f"integers have at most {MAX_INTEGER_CHARS}")
        value: int = super().construct_yaml_int(node)
        return value


SpecLoader.add_constructor("tag:yaml.org,2002:int", SpecLoader.construct_yaml_int)


def _key_text(key: object) -> str:
    text = repr(key)
    return text if len(text) <= 60 else text[:57] + "..."


def load_yaml(text: str) -> object:
    """The one document of ``text`` as plain data, within the bounds above.

    Raises:
        YamlRefused: a bound was crossed or a key repeated.
        yaml.YAMLError: the text is not YAML.
    """
    loader = SpecLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
