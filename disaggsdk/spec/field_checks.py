"""Single-field checks of spec values, run when a spec class is constructed.

Each spec field declares what it does and its check in its attrs metadata (`about`), so the
reference (`docs/spec.md`), the JSON Schema and the check itself cannot drift apart. Every failing
field of one object is reported at once (`FieldErrors`), so a YAML file with three mistakes gets
three messages, each naming the field; the loader prefixes the YAML path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs


@attrs.frozen
class Check:
    """A check of one value, named in the reference and mirrored in the JSON Schema.

    Attributes:
        name: how `docs/spec.md` names it ("positive", "one of HND, NHD").
        test: returns what is wrong with a value, or None when it is fine.
        schema: the same bound as JSON Schema keywords, so an editor flags it while you type;
            empty where JSON Schema cannot say it (a power of two).
    """

    name: str
    test: Callable[[Any], str | None]
    schema: Mapping[str, Any] = attrs.field(factory=dict, eq=False, hash=False)

    def __call__(self, value: Any) -> str | None:
        return self.test(value)


class FieldErrors(ValueError):
    """One or more fields of one spec object hold invalid values.

    Attributes:
        problems: (field name, message) pairs; the message says what would be valid.
    """

    def __init__(self, owner: str, problems: list[tuple[str, str]]):
        self.owner = owner
        self.problems = problems
        super().__init__("; ".join(f"{owner}.{f}: {m}" for f, m in problems))


def about(doc: str, check: Check | None = None) -> dict[str, Any]:
    """The attrs metadata of a spec field: ``attrs.field(default=8, metadata=about("...", positive))``.

    Args:
        doc: what the key does, one or two sentences; shown in docs/spec.md and in editors.
        check: the single-value check `check_fields` runs on it, if any.
    """
    return {"doc": doc} if check is None else {"doc": doc, "check": check}


def check_fields(obj: Any) -> None:
    """Run the check each field of the attrs object ``obj`` declares (`about`).

    Raises:
        FieldErrors: listing every failing field of ``obj``.
    """
    problems = []
    for field in attrs.fields(type(obj)):
        check = field.metadata.get("check")
        message = check(getattr(obj, field.name)) if check is not None else None
        if message:
            problems.append((field.name, message))
    if problems:
        raise FieldErrors(type(obj).__name__, problems)


def _positive(value: Any) -> str | None:
    if value <= 0:
        return f"must be a positive number, got {value!r}"
    return None


def _non_negative(value: Any) -> str | None:
    if value < 0:
        return f"must be 0 or more, got {value!r}"
    return None


def _power_of_two(value: Any) -> str | None:
    if value <= 0 or value & (value - 1):
        lower = 1 << max(0, int(value).bit_length() - 1) if value > 0 else 1
        return f"must be a power of two (e.g. {lower} or {lower * 2}), got {value!r}"
    return None


def _port(value: Any) -> str | None:
    if not 0 <= value <= 65535:
        return f"must be a TCP port in 0..65535 (0 picks a free one), got {value!r}"
    return None


def _served_name(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 128 or any(c.isspace() for c in value):
        return f"must be 1 to 128 characters without spaces, got {value!r}"
    return None


positive = Check("positive", _positive, {"exclusiveMinimum": 0})
non_negative = Check("0 or more", _non_negative, {"minimum": 0})
served_name = Check("1..128 characters, no spaces", _served_name, {"minLength": 1, "maxLength": 128,
                                                                    "pattern": "^\\S+$"})
power_of_two = Check("power of two", _power_of_two, {"minimum": 1})
port = Check("TCP port 0..65535", _port, {"minimum": 0, "maximum": 65535})


def in_range(low: int, high: int) -> Check:
    """A check that the value lies in ``low .. high`` (both included)."""

    def test(value: Any) -> str | None:
        if not low <= value <= high:
            return f"must be in {low}..{high}, got {value!r}"
        return None

    return Check(f"{low}..{high}", test, {"minimum": low, "maximum": high})


def choice(options: tuple[str, ...]) -> Check:
    """A check that the value is one of ``options``."""

    def test(value: Any) -> str | None:
        if value not in options:
            return f"{value!r} is not valid; use one of {', '.join(options)}"
        return None

    return Check(f"one of {', '.join(options)}", test, {"enum": list(options)})
