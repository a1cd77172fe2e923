"""Sizes bounded before planning (issue 55, finding 7): every integer key has an upper bound, every wait at most a
day; a deployment past 4,096 ranks or 16,384 instance pairs is refused by `validate` and by the planner itself. The
same classes fuzzed: huge integers and non-finite or huge numbers in every key."""

import math
import typing

import attrs
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disaggsdk.errors import SpecError
from disaggsdk.plan import make_plan
from disaggsdk.plan.memory import check_memory
from disaggsdk.spec import Role, Spec, parse_spec_yaml
from disaggsdk.spec.field_checks import MAX_WAIT_S, check_of
from disaggsdk.spec.rules import size_problems, spec_problems
from disaggsdk.spec.topology import MAX_INSTANCE_PAIRS, MAX_RANKS
from disaggsdk.spec.yaml_io import CPU_STARTER_SPEC

FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def spec_keys(cls: type = Spec, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object, object]]:
    """Every key of the spec that holds a value: (path, type hint, attrs field)."""
    hints = typing.get_type_hints(cls)
    keys = []
    for field in attrs.fields(cls):
        hint = hints[field.name]
        if attrs.has(hint):
            keys += spec_keys(hint, prefix + (field.name,))
        else:
            keys.append((prefix + (field.name,), hint, field))
    return keys


def _holds(hint: object, kind: type) -> bool:
    return hint is kind or kind in typing.get_args(hint)


INTEGER_KEYS = [(path, field) for path, hint, field in spec_keys() if _holds(hint, int) or hint == tuple[int, ...]]
NUMBER_KEYS = [(path, field) for path, hint, field in spec_keys() if _holds(hint, float)]


def bounds(field) -> tuple[float, float]:
    """The (minimum, maximum) a key's check declares (for a list, of each item)."""
    schema = dict(check_of(field).schema)
    schema = dict(schema.get("items", schema))
    low = schema.get("minimum", schema.get("exclusiveMinimum", -math.inf))
    return low, schema.get("maximum", math.inf)


def with_value(path: tuple[str, ...], value: object) -> str:
    data = yaml.safe_load(CPU_STARTER_SPEC)
    section = data
    for name in path[:-1]:
        section = section.setdefault(name, {})
    section[path[-1]] = value
    return yaml.safe_dump(data)


def test_every_integer_key_declares_an_upper_bound_and_every_wait_a_day():
    assert len(INTEGER_KEYS) >= 20
    for path, field in INTEGER_KEYS:
        assert check_of(field) is not None and bounds(field)[1] < 2**63, path
    waits = [(path, field) for path, field in NUMBER_KEYS if path[-1].endswith(("_s", "_ms"))]
    assert len(waits) >= 10
    for path, field in waits:
        assert bounds(field)[1] == MAX_WAIT_S * (1000 if path[-1].endswith("_ms") else 1), path


# the finding: replicas of 10^23 passed validate; plan on 100,000 decode replicas ran past 60 s


def test_validate_refuses_a_replica_count_past_the_bound(tmp_path, run_cli):
    (tmp_path / "huge.yaml").write_text(CPU_STARTER_SPEC + "decode: {replicas: 100000000000000000000000}\n")
    result = run_cli("validate", str(tmp_path / "huge.yaml"), timeout_s=60)
    assert result.returncode == 2, result.stdout
    assert ("$.decode.replicas: must be at most 4,096 (a plan places at most 4,096 ranks, 8 x the largest shipped "
            "spec, so `plan` takes seconds), got 100000000000000000000000") in result.stderr


def test_plan_refuses_100000_decode_replicas_at_once(tmp_path, run_cli):
    (tmp_path / "wide.yaml").write_text(CPU_STARTER_SPEC + "decode: {replicas: 100000}\n")
    result = run_cli("plan", str(tmp_path / "wide.yaml"), timeout_s=60)  # ran past 60 s
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "$.decode.replicas: must be at most 4,096" in result.stderr


def test_a_deployment_past_the_rank_or_pair_bound_is_refused_by_the_rules_and_the_planner():
    over = parse_spec_yaml(CPU_STARTER_SPEC)
    over = attrs.evolve(over, prefill=Role(replicas=129), decode=Role(replicas=128))  # 16,512 pairs
    (problem,) = size_problems(over)
    assert problem.startswith("$.prefill.replicas: 129 prefill x 128 decode instances make 16,512 pairs; a plan "
                              "routes every pair and takes at most 16,384")
    assert problem in spec_problems(over)
    with pytest.raises(SpecError, match="16,512 pairs"):
        make_plan(over)  # a spec built in Python skips the rules; the planner asks before it places a rank
    ranks = attrs.evolve(over, prefill=Role(replicas=1, tp=16), decode=Role(replicas=4, tp=1024))
    (problem,) = size_problems(ranks)
    assert problem.startswith("$.decode.replicas: 1 prefill x 16 ranks + 4 decode x 1,024 ranks (tp*dp) make 4,112 "
                              "ranks; a plan places at most 4,096")


@st.composite
def roles(draw):
    sizes = st.integers(0, 12).map(lambda k: 2**k)  # 1..4,096, each size as likely
    return Role(replicas=draw(sizes), tp=draw(sizes), dp=draw(sizes))


@FUZZ
@given(roles(), roles())
def test_fuzzed_deployment_sizes_are_refused_exactly_past_the_bounds(prefill, decode):
    spec = attrs.evolve(parse_spec_yaml(CPU_STARTER_SPEC), prefill=prefill, decode=decode)
    ranks = sum(role.replicas * role.tp * role.dp for role in (prefill, decode))
    over = ranks > MAX_RANKS or prefill.replicas * decode.replicas > MAX_INSTANCE_PAIRS
    assert bool(size_problems(spec)) == over
    if over:
        with pytest.raises(SpecError):
            make_plan(spec)


# every integer and number key fuzzed


huge_integers = st.one_of(st.integers(2**31, 10**39), st.integers(-(10**38), -1),  # 40 characters at most
                          st.integers(0, 40).map(lambda k: 2**k), st.sampled_from([4096, 4097, 65536, 2**32]))


@FUZZ
@given(st.sampled_from(INTEGER_KEYS), huge_integers)
def test_fuzzed_integers_in_every_key_are_refused_past_its_bound_naming_it(key, value):
    path, field = key
    low, high = bounds(field)
    text = with_value(path, [value] if path[-1] == "cuda_devices" else value)
    dotted = "$." + ".".join(path)
    try:
        spec = parse_spec_yaml(text)
        check_memory(spec)
    except SpecError as exc:
        assert all("\n" not in problem and len(problem) < 400 for problem in exc.problems), exc.problems
        if not low <= value <= high:
            assert any(problem.startswith(f"{dotted}: ") for problem in exc.problems), (dotted, exc.problems)
        return
    assert low <= value <= high, f"{dotted} = {value} was accepted"


huge_numbers = st.one_of(st.sampled_from([math.inf, -math.inf, math.nan, 1e300, 1e10, 86_400.5, 86_400_000.5]),
                         st.floats(allow_nan=True, allow_infinity=True))


@FUZZ
@given(st.sampled_from(NUMBER_KEYS), huge_numbers)
def test_fuzzed_numbers_in_every_key_are_refused_when_not_finite_or_past_a_bound(key, value):
    path, field = key
    low, high = bounds(field)
    dotted = "$." + ".".join(path)
    try:
        spec = parse_spec_yaml(with_value(path, value))
        check_memory(spec)
    except SpecError as exc:
        assert all("\n" not in problem and len(problem) < 400 for problem in exc.problems), exc.problems
        if not (math.isfinite(value) and low <= value <= high):
            assert any(problem.startswith(f"{dotted}: ") for problem in exc.problems), (dotted, exc.problems)
        return
    assert math.isfinite(value) and low <= value <= high, f"{dotted} = {value} was accepted"
