"""Single-field checks of spec values, run when a spec class is constructed.

Every failing field of one object is reported at once (`FieldErrors`), so a YAML file with three
mistakes gets three messages, each naming the field; the loader prefixes the YAML path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Check = Callable[[Any], "str | None"]  # returns what is wrong, or None when the value is fine


class FieldErrors(ValueError):
    """One or more fields of one spec object hold invalid values.

    Attributes:
        problems: (field name, message) pairs; the message says what would be valid.
    """

    def __init__(self, owner: str, problems: list[tuple[str, str]]):
        self.owner = owner
        self.problems = problems
        super().__init__("; ".join(f"{owner}.{f}: {m}" for f, m in problems))


def check_fields(obj: Any, **checks: Check) -> None:
    """Run one check per named field of ``obj``; raise `FieldErrors` listing every failure."""
    problems = []
    for field, check in checks.items():
        message = check(getattr(obj, field))
        if message:
            problems.append((field, message))
    if problems:
        raise FieldErrors(type(obj).__name__, problems)


def positive(value: Any) -> str | None:
    if value <= 0:
        return f"must be a positive number, got {value!r}"
    return None


def power_of_two(value: Any) -> str | None:
    if value <= 0 or value & (value - 1):
        lower = 1 << max(0, int(value).bit_length() - 1) if value > 0 else 1
        return f"must be a power of two (e.g. {lower} or {lower * 2}), got {value!r}"
    return None


def port(value: Any) -> str | None:
    if not 0 <= value <= 65535:
        return f"must be a TCP port in 0..65535 (0 picks a free one), got {value!r}"
    return None


def choice(options: tuple[str, ...]) -> Check:
    def check(value: Any) -> str | None:
        if value not in options:
            return f"{value!r} is not valid; use one of {', '.join(options)}"
        return None

    return check
