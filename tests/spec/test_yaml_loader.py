"""Hostile spec files (issue 55, finding 7): aliases, nesting, a key twice and long integers are refused while the
file is read, each in one line that says where and never quotes an expanded value; the same classes fuzzed."""

import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disaggsdk.errors import SpecError
from disaggsdk.spec import load_spec, parse_spec_yaml, spec_to_dict
from disaggsdk.spec.yaml_io import CPU_STARTER_SPEC, MAX_SPEC_BYTES
from disaggsdk.spec.yaml_loader import MAX_ALIASES, MAX_DEPTH, MAX_INTEGER_CHARS, MAX_NODES

FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
LIMIT_MESSAGES = ("aliases expand the spec past", "values and keys", "nested deeper than", "aliases (*name)",
                  "is inside the node it names")
# a problem quotes at most a cut value (`field_checks.shown`): far below what an expansion prints
MAX_PROBLEM_CHARS = 400


def billion_laughs(levels: int = 9) -> str:
    """The classic alias bomb: nine aliases of nine aliases ..., 9^levels strings once expanded."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return CPU_STARTER_SPEC + "\n".join(lines) + f"\ndecode: *a{levels - 1}\n"


def problems_of(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec_yaml(text, source="spec.yaml")
    return info.value.problems


def assert_one_line_each(problems: list[str]) -> None:
    for problem in problems:
        assert "\n" not in problem and len(problem) <= MAX_PROBLEM_CHARS, problem[:1000]


# aliases


def test_billion_laughs_is_refused_in_one_line_before_it_expands(tmp_path, run_cli):
    (tmp_path / "bomb.yaml").write_text(billion_laughs())
    # before the loader counted, this ran past 60 s at 5.5 GB and printed the expanded value
    result = run_cli("validate", str(tmp_path / "bomb.yaml"), timeout_s=60)
    assert result.returncode == 2, result.stderr[:2000]
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "error:" in line]
    assert f"bomb.yaml:10:10: the aliases expand the spec past {MAX_NODES:,} values and keys" in line, line
    assert "lol" not in result.stderr + result.stdout


def test_a_few_aliases_and_merge_keys_still_load():
    spec = parse_spec_yaml(CPU_STARTER_SPEC + "prefill: &role {tp: 2}\ndecode: {<<: *role, replicas: 2}\n")
    assert (spec.prefill.tp, spec.decode.tp, spec.decode.replicas) == (2, 2, 2)


def test_an_alias_inside_the_node_it_names_is_refused():
    (problem,) = problems_of(CPU_STARTER_SPEC + "decode: &d {tp: *d}\n")
    assert problem == ("spec.yaml:6:17: alias *d is inside the node it names (a structure that contains itself); "
                       "write the value out")


def test_more_aliases_than_the_limit_are_refused():
    text = CPU_STARTER_SPEC + "name: &n x\nlaunch: {allowed: [" + ", ".join(["*n"] * (MAX_ALIASES + 1)) + "]}\n"
    (problem,) = problems_of(text)
    assert f"more than {MAX_ALIASES} aliases (*name)" in problem


@st.composite
def alias_documents(draw):
    """A spec whose keys anchor lists of strings and aliases of earlier anchors (and nested lists of them),
    the last one aliased as a section; returns the text and whether it crosses a bound (counted here as the
    loader should: every node once, an alias as the nodes and height of what it names)."""
    num_anchors = draw(st.integers(1, 40))
    nodes, heights, lines, num_aliases = [], [], [], 0

    def items(i: int, level: int) -> tuple[str, int, int]:  # text, nodes, height of one list
        nonlocal num_aliases
        parts, count, tallest = [], 1, 0
        for _ in range(draw(st.integers(0, 9))):
            kind = draw(st.sampled_from(["str", "alias", "list"] if level < 2 else ["str", "alias"]))
            if kind == "alias" and i > 0:
                r = draw(st.integers(max(0, i - 5), i - 1))
                parts.append(f"*a{r}")
                count, tallest, num_aliases = count + nodes[r], max(tallest, heights[r]), num_aliases + 1
            elif kind == "list":
                text, n, h = items(i, level + 1)
                parts.append(text)
                count, tallest = count + n, max(tallest, h)
            else:
                parts.append("lol")
                count, tallest = count + 1, max(tallest, 1)
        return f"[{', '.join(parts)}]", count, 1 + tallest

    for i in range(num_anchors):
        text, n, h = items(i, 0)
        nodes.append(n)
        heights.append(h)
        lines.append(f"x{i}: &a{i} {text}")
    section = draw(st.sampled_from(["decode", "serve", "launch", "name", "seed"]))
    total = 1 + 2 * len(CPU_STARTER_SPEC.splitlines()) + sum(1 + n for n in nodes) + 1 + nodes[-1]
    crosses = (total > MAX_NODES or 1 + max(heights) > MAX_DEPTH or num_aliases + 1 > MAX_ALIASES)
    return CPU_STARTER_SPEC + "\n".join(lines) + f"\n{section}: *a{num_anchors - 1}\n", crosses


@FUZZ
@given(alias_documents())
def test_fuzzed_alias_structures_are_refused_past_the_bounds_and_never_printed(document):
    text, crosses = document
    problems = problems_of(text)  # unknown keys x0, x1, ... at the least
    assert_one_line_each(problems)
    refused = any(message in problems[0] for message in LIMIT_MESSAGES)
    assert refused == crosses, problems[0]
    if refused:
        assert len(problems) == 1


# nesting


def test_deep_nesting_is_one_line_and_exit_2_not_a_recursion_error(tmp_path, run_cli):
    (tmp_path / "deep.yaml").write_text("model: " + "[" * 5000 + "]" * 5000 + "\n")
    result = run_cli("validate", str(tmp_path / "deep.yaml"), timeout_s=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "error:" in line]
    assert f"deep.yaml:1:39: nested deeper than {MAX_DEPTH} levels" in line


@st.composite
def nested_documents(draw):
    """A section nested ``depth`` collections deep in flow or block style, a scalar innermost; returns the text
    and the depth of that scalar (the root mapping is 1)."""
    depth = draw(st.integers(1, 3 * MAX_DEPTH))
    kinds = draw(st.lists(st.sampled_from(["seq", "map"]), min_size=depth, max_size=depth))
    if draw(st.booleans()):  # flow: decode: [{k: [1]}]
        opening = "".join("[" if kind == "seq" else "{k: " for kind in kinds)
        closing = "".join("]" if kind == "seq" else "}" for kind in reversed(kinds))
        text = f"decode: {opening}1{closing}\n"
    else:  # block: each level indented two more
        lines = ["decode:"]
        for level, kind in enumerate(kinds):
            lines.append("  " * (level + 1) + ("-" if kind == "seq" else "k:"))
        lines[-1] += " 1"
        text = "\n".join(lines) + "\n"
    return CPU_STARTER_SPEC + text, depth + 2


@FUZZ
@given(nested_documents())
def test_fuzzed_nesting_is_refused_past_the_depth_bound(document):
    text, depth = document
    problems = problems_of(text)
    assert_one_line_each(problems)
    refused = f"nested deeper than {MAX_DEPTH} levels" in problems[0]
    assert refused == (depth > MAX_DEPTH), (depth, problems)


# a key twice


def test_a_duplicate_key_is_refused_naming_it_and_both_lines():
    (problem,) = problems_of("model: qwen3-coder\ndecode: {tp: 8}\ndecode: {tp: 1}\n")
    assert problem == "spec.yaml:3:1: duplicate key 'decode' (first at line 2); YAML keeps only the last: write it once"


def _block(data: dict, indent: int, lines: list[str], where: dict) -> None:
    """Emit ``data`` as block YAML into ``lines``; in the mapping ``where["mapping"]``, the key ``where["key"]``
    again at ``where["position"]`` among its siblings (recording both lines)."""
    entries = list(data.items())
    if data is where["mapping"]:
        key = where["key"]
        entries.insert(where["position"], (key, where["value"]))
    for key, value in entries:
        if data is where["mapping"] and key == where["key"]:
            where.setdefault("lines", []).append(len(lines) + 1)
        if isinstance(value, dict) and value:
            lines.append(" " * indent + f"{key}:")
            _block(value, indent + 2, lines, where)
        else:
            lines.append(" " * indent + f"{key}: {json.dumps(value)}")


@st.composite
def duplicated_documents(draw):
    """Every key of a spec written out, one of them (in any section) written twice with the same or another
    value; returns the text, the key and the lines of its two entries."""
    data = spec_to_dict(parse_spec_yaml(CPU_STARTER_SPEC))
    mappings = [data] + [v for v in data.values() if isinstance(v, dict)]
    mappings += [v for m in mappings[1:] for v in m.values() if isinstance(v, dict)]
    mapping = draw(st.sampled_from(mappings))
    key = draw(st.sampled_from(sorted(mapping)))
    value = draw(st.sampled_from([mapping[key], 1, "x", [1, 2], {}]))
    where = {"mapping": mapping, "key": key, "value": value, "position": draw(st.integers(0, len(mapping)))}
    lines: list[str] = []
    _block(data, 0, lines, where)
    return "\n".join(lines) + "\n", key, where["lines"]


@FUZZ
@given(duplicated_documents())
def test_fuzzed_duplicate_keys_are_refused_with_the_key_and_its_lines(document):
    text, key, (first, second) = document
    (problem,) = problems_of(text)
    assert problem.startswith(f"spec.yaml:{second}:"), problem
    assert f"duplicate key {key!r} (first at line {first})" in problem, problem


# integers and size


def with_value(field: str, text: str) -> str:
    """The CPU starter spec with ``field`` ("seed", "decode.replicas", none of the starter's) written as ``text``."""
    section, _, key = field.rpartition(".")
    return CPU_STARTER_SPEC + (f"{section}: {{{key}: {text}}}\n" if section else f"{key}: {text}\n")


@FUZZ
@given(st.sampled_from(["seed", "serve.port", "decode.replicas", "engine.num_pages", "speculative.num_tokens"]),
       st.one_of(st.integers(MAX_INTEGER_CHARS + 1, 20_000).map(lambda n: "9" * n),
                 st.integers(MAX_INTEGER_CHARS // 2, 20_000).map(lambda n: "1" + ":1" * n)))
def test_fuzzed_integers_of_thousands_of_digits_are_refused_as_written(field, digits):
    # 5,000 digits were a ValueError traceback (Python's int conversion limit); YAML 1.1's base 60 ("1:1:1...")
    # grows a number with every part
    (problem,) = problems_of(with_value(field, digits))
    assert f"an integer written with {len(digits):,} characters" in problem, problem


def test_a_file_over_the_size_bound_is_not_read(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(CPU_STARTER_SPEC + "#" * MAX_SPEC_BYTES + "\n")
    with pytest.raises(SpecError, match=rf"big\.yaml: more than {MAX_SPEC_BYTES:,} bytes is not a spec"):
        load_spec(path)


def test_a_long_string_is_quoted_cut_in_its_error():
    (problem,) = problems_of(CPU_STARTER_SPEC + f"decode: {{tp: {json.dumps('x' * 100_000)}}}\n")
    assert problem.startswith("spec.yaml: $.decode.tp: expected an integer, got 'xxx") and len(problem) < 200


def test_yaml_is_still_plain_yaml_for_every_shipped_spec():
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[2] / "specs").glob("*.yaml")):
        assert load_spec(path) is not None
        assert yaml.safe_load(path.read_text())  # nothing the loader refuses that PyYAML reads differently
