"""The spec reference (docs/spec.md) and JSON Schema (docs/spec.schema.json), generated from the classes.

Both are read off `Spec` and its section classes (each field's type, default and `about`
metadata) and the `Rule` table of `spec.rules`, so neither can describe a key the loader does not
know. tests/spec/test_reference.py fails when the committed files differ from what this module
produces; regenerate them with ``python -m disaggsdk.spec.reference --write`` from the repository
root. Imports no torch: it runs wherever a spec can be validated.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path

import attrs

from disaggsdk.models import resolve_model
from disaggsdk.spec.field_checks import JsonValue, check_of, doc_of
from disaggsdk.spec.rules import MODEL_KEYS, RULES, Rule
from disaggsdk.spec.topology import MAX_INSTANCE_PAIRS, MAX_RANKS
from disaggsdk.spec.types import Spec
from disaggsdk.spec.yaml_io import MAX_SPEC_BYTES
from disaggsdk.spec.yaml_loader import MAX_ALIASES, MAX_DEPTH, MAX_INTEGER_CHARS, MAX_NODES

REGENERATE = "python -m disaggsdk.spec.reference --write"
MARKDOWN_NAME = "spec.md"
SCHEMA_NAME = "spec.schema.json"
# draft-07: the newest draft yaml-language-server (VS Code, Neovim, Helix) understands fully.
SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"
# `$.model` is not checked by a `Rule` but by resolving it before any rule runs (rules.MODEL_KEYS).
MODEL_CHECK = resolve_model.__name__
MODEL_CHECK_SUMMARY = ("`model` is a catalog name or a checkpoint directory with a config.json; "
                       "every other rule needs its architecture.")

_JSON_TYPES: dict[object, str] = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}


@attrs.frozen
class Key:
    """One YAML key of the spec: where it is and the attrs field that defines it.

    Attributes:
        path: its YAML path (``$.decode.tp``), as errors and `Rule.keys` spell it.
        field: the attrs field; its metadata holds the doc and the single-value check.
        hint: the field's resolved type (``int``, ``Literal["HND", "NHD"]``, an attrs class).
    """

    path: str
    field: attrs.Attribute[object]
    hint: object  # a type form: a class, a Literal, a union, tuple[str, ...]

    @property
    def doc(self) -> str:
        return doc_of(self.field)

    @property
    def section(self) -> type[attrs.AttrsInstance] | None:
        """The attrs class of a key that holds a mapping of keys; None for a key of one value."""
        return _section_class(self.hint)

    @property
    def is_section(self) -> bool:
        """True when the key holds a mapping of keys (an attrs class) rather than one value."""
        return self.section is not None


@attrs.frozen
class Section:
    """The keys written directly under one mapping of the spec (``$`` or ``$.kv``).

    Attributes:
        path: the mapping's YAML path.
        cls: the attrs class it is loaded into.
        doc: what the mapping is (its key's doc, then the class docstring).
        keys: its keys in declaration order, sections included.
    """

    path: str
    cls: type[attrs.AttrsInstance]
    doc: str
    keys: tuple[Key, ...]


def _section_class(hint: object) -> type[attrs.AttrsInstance] | None:
    return hint if isinstance(hint, type) and attrs.has(hint) else None


def spec_sections(root: type[attrs.AttrsInstance] = Spec, path: str = "$", doc: str = "") -> list[Section]:
    """Every mapping of the spec, ``root`` first, each followed by the sections under it.

    Args:
        root: an attrs class; ``Spec`` for the deployment spec.
        path: the YAML path of ``root``.
        doc: what ``root`` is, shown before its docstring.
    """
    hints = typing.get_type_hints(root)
    keys = tuple(Key(f"{path}.{f.name}", f, hints[f.name]) for f in attrs.fields(root))
    class_doc = inspect.getdoc(root) or ""
    sections = [Section(path, root, _join_docs(doc, class_doc), keys)]
    for key in keys:
        if key.section is not None:
            sections += spec_sections(key.section, key.path, key.doc)
    return sections


def _join_docs(key_doc: str, class_doc: str) -> str:
    # "How KV pages travel." then "How KV pages travel between prefill and decode." says it twice.
    def norm(text: str) -> str:
        return text.lower().rstrip(".").removeprefix("the ")

    if not key_doc or norm(class_doc).startswith(norm(key_doc)):
        return class_doc
    return f"{key_doc} {class_doc}"


def check_name_of(key: Key) -> str | None:
    """The name of ``key``'s single-value check ("positive"), or None when it has none."""
    check = check_of(key.field)
    return check.name if check is not None else None


def rules_reading(key: Key, rules: Sequence[Rule] = RULES) -> list[str]:
    """The names of the cross-field rules that check ``key`` (those whose `Rule.keys` hold its path)."""
    names = [MODEL_CHECK] if key.path in MODEL_KEYS else []
    return names + [rule.name for rule in rules if key.path in rule.keys]


# Markdown


def _type_text(hint: object) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(f"`{choice}`" for choice in typing.get_args(hint))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_text(arg) for arg in typing.get_args(hint))
    if _section_class(hint) is not None:
        return "mapping"
    if typing.get_origin(hint) is tuple:  # tuple[str, ...]: a YAML list
        return f"list of {_type_text(typing.get_args(hint)[0])}"
    return _JSON_TYPES[hint]


def _default_text(key: Key) -> str:
    default = key.field.default
    if key.is_section:
        return f"see `{key.path}`"
    if isinstance(default, (bool, tuple)) or default is None:
        return f"`{json.dumps(list(default) if isinstance(default, tuple) else default)}`"
    return f"`{default}`"


def _cell(text: str) -> str:
    # A literal `|` would end the table cell early.
    return text.replace("|", "\\|")


def _checks_text(key: Key, rules: Sequence[Rule]) -> str:
    # Rule names are code (`tp_divides_query_heads`); a check's name is words ("one of HND, NHD").
    check = check_name_of(key)
    names = ([check] if check else []) + [f"`{name}`" for name in rules_reading(key, rules)]
    return "; ".join(names) or "-"


def _section_markdown(section: Section, rules: Sequence[Rule]) -> list[str]:
    lines = [f"## `{section.path}`", "", section.doc, ""]
    lines += ["| key | type | default | what it does | checked by |", "|---|---|---|---|---|"]
    for key in section.keys:
        checks = _checks_text(key, rules)
        cells = (f"`{key.path}`", _type_text(key.hint), _default_text(key), key.doc, checks)
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return lines + [""]


def render_markdown(root: type[attrs.AttrsInstance] = Spec, rules: Sequence[Rule] = RULES) -> str:
    """docs/spec.md: a table of keys per section, then what each rule requires.

    Args:
        root: the spec class to describe.
        rules: the cross-field rules whose names fill the "checked by" column.
    Returns:
        The Markdown text, ending in a newline.
    """
    lines = [
        "# Spec reference",
        "",
        f"<!-- Generated from the classes of disaggsdk/spec/ and its rules.py by `{REGENERATE}`; do not edit. -->",
        "",
        "Every key a deployment spec (YAML, or `Cluster(...).spec`) may hold. Errors name keys by "
        "these paths (`$.decode.tp`). \"Checked by\" names the key's own check, run as the spec is "
        f"built, and the cross-field rules that read it (listed at the end). `{SCHEMA_NAME}` holds "
        "the same keys for editors: start a YAML file with "
        f"`# yaml-language-server: $schema=../docs/{SCHEMA_NAME}` (path relative to the file).",
        "",
    ]
    for section in spec_sections(root):
        lines += _section_markdown(section, rules)
    lines += ["## Rules", "", "Checks across keys, run after every key is valid on its own.", ""]
    lines += ["| rule | requires | keys |", "|---|---|---|"]
    rows = [(MODEL_CHECK, MODEL_CHECK_SUMMARY, MODEL_KEYS)] + [(r.name, r.summary, r.keys) for r in rules]
    for name, summary, keys in rows:
        cells = (f"`{name}`", summary, ", ".join(f"`{k}`" for k in keys))
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines + ["", *_bounds_markdown()]) + "\n"


def _bounds_markdown() -> list[str]:
    """What a spec file and a deployment may not exceed (`spec.yaml_loader`, `spec.topology`)."""
    return [
        "## Bounds",
        "",
        "A spec is a few hundred values nested four deep, so a file far past that is a mistake or an attack. It is "
        "refused while it is read, before anything is built from it, in one line naming the file, line and column "
        "(never quoting an expanded value):",
        "",
        f"- at most {MAX_SPEC_BYTES:,} bytes;",
        f"- at most {MAX_ALIASES} aliases (`*name`), none inside the node it names, and at most {MAX_NODES:,} "
        "values and keys once the aliases are expanded (a \"billion laughs\" file is refused after reading that "
        "many);",
        f"- nesting at most {MAX_DEPTH} levels deep, aliases expanded;",
        "- every key once in its mapping (YAML keeps only the last; a merge `<<: *base` may still be overridden);",
        f"- integers written with at most {MAX_INTEGER_CHARS} characters.",
        "",
        f"A deployment has at most {MAX_RANKS:,} ranks (GPUs, or CPU rank processes; so at most as many nodes) "
        f"and {MAX_INSTANCE_PAIRS:,} (prefill, decode) instance pairs (`deployment_is_plannable`): a plan places "
        "every rank and routes every pair, and `disaggsdk plan` prints each, within seconds at these bounds. "
        "Every integer key has an upper bound in its \"checked by\" column, and every wait (`_s`, `_ms`) is at "
        "most a day, so no value can make a later stage overflow or run for ever.",
    ]


# JSON Schema


def _value_schema(hint: object) -> dict[str, JsonValue]:
    if typing.get_origin(hint) is typing.Literal:
        return {"type": "string", "enum": list(typing.get_args(hint))}
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return {"type": [_JSON_TYPES[arg] for arg in typing.get_args(hint)]}
    if typing.get_origin(hint) is tuple:  # tuple[str, ...]: a YAML list
        return {"type": "array", "items": _value_schema(typing.get_args(hint)[0])}
    return {"type": _JSON_TYPES[hint]}


def _json_default(key: Key) -> JsonValue:
    default = key.field.default
    if isinstance(default, tuple):  # tuple[str, ...]: a YAML list
        return list(default)
    if default is None or isinstance(default, (str, int, float, bool)):
        return default
    raise TypeError(f"{key.path}: default {default!r} is not a JSON value; give the key a plain default")


def _object_schema(section: Section, by_path: dict[str, Section]) -> dict[str, JsonValue]:
    properties: dict[str, JsonValue] = {}
    for key in section.keys:
        if key.is_section:
            # `prefill:` with nothing after it loads as an empty mapping (convert.py), hence null.
            schema: dict[str, JsonValue] = {**_object_schema(by_path[key.path], by_path), "type": ["object", "null"]}
        else:
            schema = {"description": key.doc, **_value_schema(key.hint), "default": _json_default(key)}
            check = check_of(key.field)
            if check is not None:
                schema.update(check.schema)
        properties[key.field.name] = schema
    return {"description": section.doc, "type": "object", "additionalProperties": False,
            "properties": properties}


def json_schema(root: type[attrs.AttrsInstance] = Spec) -> dict[str, JsonValue]:
    """The JSON Schema (draft-07) of a spec file, for editors and for checking YAML without Python.

    Objects forbid unknown keys, as the loader does; each key has its doc as ``description``, its
    ``default``, ``enum`` for a fixed set of choices and its check's bounds (`Check.schema`).
    Cross-field rules and checks JSON Schema cannot say (a power of two) stay with the loader.
    """
    sections = spec_sections(root)
    by_path = {section.path: section for section in sections}
    return {"$schema": SCHEMA_DIALECT, "title": "disaggsdk deployment spec",
            **_object_schema(sections[0], by_path)}


def render_schema(root: type[attrs.AttrsInstance] = Spec) -> str:
    """docs/spec.schema.json: `json_schema` as indented JSON ending in a newline."""
    return json.dumps(json_schema(root), indent=2, ensure_ascii=False) + "\n"


def generated_files() -> dict[str, str]:
    """File name under docs/ -> the text this module generates for it."""
    return {MARKDOWN_NAME: render_markdown(), SCHEMA_NAME: render_schema()}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m disaggsdk.spec.reference [--schema] [--write [--docs-dir DIR]]``."""
    parser = argparse.ArgumentParser(prog="python -m disaggsdk.spec.reference", description=__doc__.splitlines()[0])
    parser.add_argument("--schema", action="store_true", help=f"print {SCHEMA_NAME} instead of {MARKDOWN_NAME}")
    parser.add_argument("--write", action="store_true", help=f"write {MARKDOWN_NAME} and {SCHEMA_NAME} into --docs-dir")
    parser.add_argument("--docs-dir", type=Path, default=Path("docs"),
                        help="where --write puts them (default: docs, run from the repository root)")
    args = parser.parse_args(argv)
    if not args.write:
        sys.stdout.write(render_schema() if args.schema else render_markdown())
        return 0
    if not args.docs_dir.is_dir():
        print(f"{args.docs_dir}: no such directory; run from the repository root or pass --docs-dir",
              file=sys.stderr)
        return 2
    for name, text in generated_files().items():
        (args.docs_dir / name).write_text(text)
        print(f"wrote {args.docs_dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
