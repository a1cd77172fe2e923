"""Dicts <-> spec objects, with every problem reported at its YAML path.

cattrs does the structuring (one converter, strict scalar hooks so `16.5` is never silently a
page size of 16); this module turns its nested exception groups into messages such as
``$.decode.tp: expected an integer, got 'eight' (str)`` and
``$.decod: unknown key; did you mean 'decode'?``.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Callable

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError, IterableValidationNote

from disaggsdk.errors import SpecError
from disaggsdk.spec.field_checks import FieldErrors, JsonValue, shown
from disaggsdk.spec.types import Spec


def _strict_int(value: object, _type: type) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {shown(value)} ({type(value).__name__})")
    return value


def _strict_bool(value: object, _type: type) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {shown(value)} ({type(value).__name__})")
    return value


def _strict_float(value: object, _type: type) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {shown(value)} ({type(value).__name__})")
    return float(value)


def _strict_str(value: object, _type: type) -> str:
    if isinstance(value, bool):  # YAML 1.1 reads off/on/yes/no unquoted as booleans
        raise TypeError(f"expected a string, got {shown(value)} (bool: YAML reads an unquoted off/on/yes/no as "
                        f"one; quote the value)")
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {shown(value)} ({type(value).__name__})")
    return value


def _literal_str(value: object, _type: type) -> str:
    # Membership is checked by the class's own field checks, whose message lists the options.
    return _strict_str(value, _type)


def _is_literal(hint: object) -> bool:
    return typing.get_origin(hint) in (typing.Literal,)


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(float, _strict_float)
    conv.register_structure_hook(bool, _strict_bool)
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook_func(_is_literal, _literal_str)

    # attrs classes: a section written as `prefill:` with nothing after it is an empty mapping.
    def section_hook_factory(cls: type[attrs.AttrsInstance]) -> Callable[[object, type], attrs.AttrsInstance]:
        inner = cattrs.gen.make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True)

        def hook(value: object, _t: type) -> attrs.AttrsInstance:
            if value is None:
                value = {}
            if not isinstance(value, dict):
                raise TypeError(f"expected a mapping of {', '.join(f.name for f in attrs.fields(cls))}, "
                                f"got {shown(value)} ({type(value).__name__})")
            return inner(value, _t)

        return hook

    conv.register_structure_hook_factory(attrs.has, section_hook_factory)
    return conv


CONVERTER = _make_converter()


def _valid_keys(cls: type) -> list[str]:
    return [f.name for f in attrs.fields(cls)]


def _key_shown(key: object) -> str:
    """A key of the file in a YAML path: as written when it is a short printable string."""
    if isinstance(key, str) and key.isprintable() and len(key) <= 60:
        return key
    return shown(key)


def _describe(exc: BaseException, path: str) -> list[str]:
    """Flatten one cattrs error tree into "<path>: <message>" lines."""
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        lines: list[str] = []
        with_notes, without = exc.group_exceptions()
        for sub, note in with_notes:
            step = f"[{note.index!r}]" if isinstance(note, IterableValidationNote) else f".{note.name}"
            lines += _describe(sub, path + step)
        for sub in without:
            lines += _describe(sub, path)
        return lines
    if isinstance(exc, ForbiddenExtraKeysError):
        valid = _valid_keys(exc.cl)
        lines = []
        for key in sorted(exc.extra_fields, key=str):
            close = [k for k in valid if k.startswith(str(key))] or difflib.get_close_matches(
                str(key), valid, n=1, cutoff=0.6
            )
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(valid)}"
            lines.append(f"{path}.{_key_shown(key)}: unknown key; {hint}")
        return lines
    if isinstance(exc, FieldErrors):
        return [f"{path}.{field}: {message}" for field, message in exc.problems]
    return [f"{path}: {exc}"]


def spec_from_dict(data: object) -> Spec:
    """Build a `Spec` from plain data (parsed YAML), checking types and single values.

    Raises:
        SpecError: every problem found, each naming its YAML path (``$.decode.tp``).
    """
    if not isinstance(data, dict):
        raise SpecError(f"$: a spec is a mapping of keys ({', '.join(_valid_keys(Spec))}), "
                        f"got {type(data).__name__}")
    try:
        return CONVERTER.structure(data, Spec)
    except (ClassValidationError, IterableValidationError, FieldErrors) as exc:
        raise SpecError(_describe(exc, "$")) from None


def spec_to_dict(spec: Spec) -> dict[str, JsonValue]:
    """Plain data for YAML/JSON: every field spelled out, `name` omitted when unset."""
    data: dict[str, JsonValue] = CONVERTER.unstructure(spec)
    if data.get("name") is None:
        data.pop("name", None)
    return data
