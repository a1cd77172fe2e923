"""Single-field checks of spec values, run when a spec class is constructed.

Each spec field declares what it does and its check in its attrs metadata (`about`), so the
reference (`docs/spec.md`), the JSON Schema and the check itself cannot drift apart. Every failing
field of one object is reported at once (`FieldErrors`), so a YAML file with three mistakes gets
three messages, each naming the field; the loader prefixes the YAML path.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, Never, NotRequired, TypeAlias, TypedDict, TypeVar

import attrs

# A JSON value (read-only, so a dict[str, int] is one): JSON Schema keywords, `spec_to_dict`, a plan's JSON.
JsonValue: TypeAlias = str | int | float | bool | None | Sequence["JsonValue"] | Mapping[str, "JsonValue"]

Value = TypeVar("Value", contravariant=True)
T = TypeVar("T")


@attrs.frozen
class Check(Generic[Value]):
    """A check of one value, named in the reference and mirrored in the JSON Schema.

    Attributes:
        name: how `docs/spec.md` names it ("positive", "one of HND, NHD").
        test: returns what is wrong with a value, or None when it is fine.
        schema: the same bound as JSON Schema keywords, so an editor flags it while you type;
            empty where JSON Schema cannot say it (a power of two).
    """

    name: str
    test: Callable[[Value], str | None]
    schema: Mapping[str, JsonValue] = attrs.field(factory=dict, eq=False, hash=False)

    def __call__(self, value: Value) -> str | None:
        return self.test(value)


# A check of some value type: what a field's metadata holds (`Check` is contravariant in its value,
# so every check is one; `check_fields` calls it with that field's value).
FieldCheck = Check[Never]


class About(TypedDict):
    """The attrs metadata of a spec field (`about`)."""

    doc: str
    check: NotRequired[FieldCheck]


class FieldErrors(ValueError):
    """One or more fields of one spec object hold invalid values.

    Attributes:
        problems: (field name, message) pairs; the message says what would be valid.
    """

    def __init__(self, owner: str, problems: list[tuple[str, str]]):
        self.owner = owner
        self.problems = problems
        super().__init__("; ".join(f"{owner}.{f}: {m}" for f, m in problems))


# How a message quotes a value from a spec: in full when short, else cut (a string of a megabyte, a list
# an alias expanded, an integer of thousands of digits), so every message stays one short line.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict = 2, 4, 4, 4
_SHOWN.maxstring, _SHOWN.maxlong, _SHOWN.maxother = 60, 40, 60
MAX_SHOWN_CHARS = 100


def shown(value: object) -> str:
    """``repr(value)`` for a message, cut to at most `MAX_SHOWN_CHARS` characters."""
    try:
        text = _SHOWN.repr(value)
    except ValueError:  # an int past Python's 4,300-digit conversion limit
        return f"an integer of {value.bit_length():,} bits" if isinstance(value, int) else type(value).__name__
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS - 3] + "..."


def about(doc: str, check: FieldCheck | None = None) -> About:
    """The attrs metadata of a spec field: ``attrs.field(default=8, metadata=about("...", positive))``.

    Args:
        doc: what the key does, one or two sentences; shown in docs/spec.md and in editors.
        check: the single-value check `check_fields` runs on it, if any.
    """
    return {"doc": doc} if check is None else {"doc": doc, "check": check}


def key(default: T, doc: str, check: Check[T] | None = None) -> T:
    """A spec field holding one value: ``page_size: int = key(16, "Tokens per KV page.", power_of_two)``.

    Args:
        default: its value when the YAML leaves it out.
        doc, check: see `about`.
    Returns:
        The attrs field (typed as its value, as `attrs.field` is, so mypy reads the default).
    """
    return attrs.field(default=default, metadata=about(doc, check))


def section(cls: type[T], doc: str) -> T:
    """A spec field holding a mapping of keys, the attrs class ``cls`` (all defaults when left out)."""
    return attrs.field(factory=cls, metadata=about(doc))


def doc_of(field: attrs.Attribute[object]) -> str:
    """What a spec field does (its `about` doc); empty when it declares none."""
    doc: str = field.metadata.get("doc", "")
    return doc


def check_of(field: attrs.Attribute[object]) -> FieldCheck | None:
    """The single-value check a spec field declares (`about`), or None."""
    check: FieldCheck | None = field.metadata.get("check")
    return check


def check_fields(obj: object) -> None:
    """Run the check each field of the attrs object ``obj`` declares (`about`).

    Raises:
        FieldErrors: listing every failing field of ``obj``.
    """
    cls = type(obj)
    if not attrs.has(cls):
        raise attrs.exceptions.NotAnAttrsClassError(f"{cls!r} is not an attrs-decorated class.")
    problems = []
    for field in attrs.fields(cls):
        check = check_of(field)
        message = check(getattr(obj, field.name)) if check is not None else None
        if message:
            problems.append((field.name, message))
    if problems:
        raise FieldErrors(cls.__name__, problems)


class CheckedFields:
    """Base of every spec section: constructing one runs its fields' checks (`check_fields`).

    A plain mixin (no fields, no slots of its own), so the attrs subclasses stay frozen slotted
    classes and their fields are exactly the YAML keys.
    """

    __slots__ = ()

    def __attrs_post_init__(self) -> None:
        check_fields(self)


def _positive(value: float) -> str | None:
    if value <= 0:
        return f"must be a positive number, got {shown(value)}"
    if isinstance(value, float) and not math.isfinite(value):  # YAML's .inf and .nan, 1e400
        return f"must be a finite number, got {shown(value)}"
    return None


def _fraction(value: float) -> str | None:
    if not 0 < value <= 1:
        return f"must be a fraction in (0, 1], got {shown(value)}"
    return None


def _port(value: int) -> str | None:
    if not 0 <= value <= 65535:
        return f"must be a TCP port in 0..65535 (0 picks a free one), got {shown(value)}"
    return None


def _served_name(value: str | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 128 or any(c.isspace() for c in value):
        return f"must be 1 to 128 characters without spaces, got {shown(value)}"
    return None


def _http_url(value: str | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        return f"must be an http:// or https:// URL (e.g. http://localhost:4318/v1/traces), got {shown(value)}"
    return None


positive = Check("positive", _positive, {"exclusiveMinimum": 0})
fraction = Check("in (0, 1]", _fraction, {"exclusiveMinimum": 0, "maximum": 1})
served_name = Check("1..128 characters, no spaces", _served_name, {"minLength": 1, "maxLength": 128,
                                                                    "pattern": "^\\S+$"})
port = Check("TCP port 0..65535", _port, {"minimum": 0, "maximum": 65535})
http_url = Check("http(s) URL", _http_url, {"pattern": "^https?://."})


def in_range(low: int, high: int, why: str | None = None) -> Check[int]:
    """A check that the value lies in ``low .. high`` (both included).

    Args:
        why: why the upper bound, for the message ("a plan places at most 4,096 ranks"); with it a value
            below ``low`` reads "must be 0 or more", one above "must be at most ... (why)".
    """

    def test(value: int) -> str | None:
        if low <= value <= high:
            return None
        if why is None:
            return f"must be in {low}..{high}, got {shown(value)}"
        if value < low:
            return f"must be {low} or more, got {shown(value)}"
        return f"must be at most {high:,} ({why}), got {shown(value)}"

    return Check(f"{low}..{high}", test, {"minimum": low, "maximum": high})


def _count_problem(value: int, high: int, why: str) -> str | None:
    if value <= 0:
        return f"must be a positive number, got {shown(value)}"
    if value > high:
        return f"must be at most {high:,} ({why}), got {shown(value)}"
    return None


def count(high: int, why: str) -> Check[int]:
    """A check of a count: positive and at most ``high``, ``why`` saying why in the message."""
    return Check(f"1..{high}", lambda value: _count_problem(value, high, why), {"minimum": 1, "maximum": high})


def positive_up_to(high: float, why: str) -> Check[float]:
    """A check of a positive number of at most ``high`` (not NaN, not infinite), ``why`` saying why the bound."""

    def test(value: float) -> str | None:
        if not value <= high:  # NaN and infinity too
            return f"must be a number up to {high:,} ({why}), got {shown(value)}"
        return _positive(value)

    return Check(f"positive, at most {high:,}", test, {"exclusiveMinimum": 0, "maximum": high})


def count_or_unset(high: int, why: str) -> Check[int | None]:
    """`count`, or None (unset)."""

    def test(value: int | None) -> str | None:
        problem = None if value is None else _count_problem(value, high, why)
        return None if problem is None else problem.replace(", got", ", or unset, got", 1)

    return Check(f"1..{high}, or unset", test, {"minimum": 1, "maximum": high})


def power_of_two(high: int, why: str) -> Check[int]:
    """A check that the value is a power of two of at most ``high`` (``why`` says why the bound)."""

    def test(value: int) -> str | None:
        if value > high:
            return f"must be a power of two of at most {high} ({why}), got {shown(value)}"
        if value <= 0 or value & (value - 1):
            lower = 1 << max(0, int(value).bit_length() - 1) if value > 0 else 1
            return f"must be a power of two (e.g. {lower} or {lower * 2}), got {shown(value)}"
        return None

    return Check(f"power of two, at most {high}", test, {"minimum": 1, "maximum": high})


# Waits a spec sets: a day at most. A longer one is a mistake (a unit silent for a day is gone), and a wait
# past threading.TIMEOUT_MAX (~292 years, 1e10 s) raises OverflowError in the thread that waits.
MAX_WAIT_S = 86_400


def duration(unit: str, zero: bool = False) -> Check[float]:
    """A check of a wait in ``unit`` ("s" or "ms"): positive (or 0 when ``zero``) and at most `MAX_WAIT_S`."""
    high = MAX_WAIT_S * (1000 if unit == "ms" else 1)
    low_text = "[0" if zero else "(0"

    def test(value: float) -> str | None:
        if not (0 <= value if zero else 0 < value) or not value <= high:  # NaN fails both
            return (f"must be in {low_text}, {high}] {unit} (a day at most: a longer wait is a mistake, and one of "
                    f"centuries overflows the timer), got {shown(value)}")
        return None

    schema: dict[str, JsonValue] = {"minimum" if zero else "exclusiveMinimum": 0, "maximum": high}
    return Check(f"in {low_text}, {high}] {unit}", test, schema)


def device_ids(high: int, max_count: int) -> Check[tuple[int, ...]]:
    """A check of a list of device ids: integers in ``0 .. high``, at most ``max_count`` of them."""

    def test(value: tuple[int, ...]) -> str | None:
        bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= high]
        if bad:
            return f"must list device ids, integers in 0..{high}, got {shown(list(value))}"
        if len(value) > max_count:
            return f"must list at most {max_count} device ids (one per GPU of the plan), got {len(value):,}"
        return None

    return Check(f"device ids 0..{high}", test, {"items": {"type": "integer", "minimum": 0, "maximum": high},
                                                "maxItems": max_count})


def choice(options: tuple[str, ...]) -> Check[str]:
    """A check that the value is one of ``options``."""

    def test(value: str) -> str | None:
        if value not in options:
            return f"{shown(value)} is not valid; use one of {', '.join(options)}"
        return None

    return Check(f"one of {', '.join(options)}", test, {"enum": list(options)})
