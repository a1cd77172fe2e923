"""Single-field checks of spec values, run when a spec class is constructed.

Each spec field declares what it does and its check in its attrs metadata (`about`), so the
reference (`docs/spec.md`), the JSON Schema and the check itself cannot drift apart. Every failing
field of one object is reported at once (`FieldErrors`), so a YAML file with three mistakes gets
three messages, each naming the field; the loader prefixes the YAML path.
"""

from __future__ import annotations

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
    return None


def _positive_or_unset(value: float | None) -> str | None:
    if value is not None and value <= 0:
        return f"must be a positive number, or unset, got {shown(value)}"
    return None


def _fraction(value: float) -> str | None:
    if not 0 < value <= 1:
        return f"must be a fraction in (0, 1], got {shown(value)}"
    return None


def _non_negative(value: float) -> str | None:
    if value < 0:
        return f"must be 0 or more, got {shown(value)}"
    return None


def _power_of_two(value: int) -> str | None:
    if value <= 0 or value & (value - 1):
        lower = 1 << max(0, int(value).bit_length() - 1) if value > 0 else 1
        return f"must be a power of two (e.g. {lower} or {lower * 2}), got {shown(value)}"
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


def _device_ids(value: tuple[int, ...]) -> str | None:
    bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int) or v < 0]
    if bad:
        return f"must list device ids, integers 0 or more, got {shown(list(value))}"
    return None


positive = Check("positive", _positive, {"exclusiveMinimum": 0})
positive_or_unset = Check("positive, or unset", _positive_or_unset, {"exclusiveMinimum": 0})
fraction = Check("in (0, 1]", _fraction, {"exclusiveMinimum": 0, "maximum": 1})
non_negative = Check("0 or more", _non_negative, {"minimum": 0})
served_name = Check("1..128 characters, no spaces", _served_name, {"minLength": 1, "maxLength": 128,
                                                                    "pattern": "^\\S+$"})
device_ids = Check("device ids 0 or more", _device_ids, {"items": {"type": "integer", "minimum": 0}})
power_of_two = Check("power of two", _power_of_two, {"minimum": 1})
port = Check("TCP port 0..65535", _port, {"minimum": 0, "maximum": 65535})
http_url = Check("http(s) URL", _http_url, {"pattern": "^https?://."})


def in_range(low: int, high: int) -> Check[int]:
    """A check that the value lies in ``low .. high`` (both included)."""

    def test(value: int) -> str | None:
        if not low <= value <= high:
            return f"must be in {low}..{high}, got {shown(value)}"
        return None

    return Check(f"{low}..{high}", test, {"minimum": low, "maximum": high})


def choice(options: tuple[str, ...]) -> Check[str]:
    """A check that the value is one of ``options``."""

    def test(value: str) -> str | None:
        if value not in options:
            return f"{shown(value)} is not valid; use one of {', '.join(options)}"
        return None

    return Check(f"one of {', '.join(options)}", test, {"enum": list(options)})
