"""Seeded JSON Schemas for structured-output tests: objects, arrays, enums, nesting, required fields
and string patterns, every one bounded (string lengths, item counts, integer ranges, no extra
properties) so that a grammar forces the output to end within a few dozen tokens."""

from __future__ import annotations

import random
from typing import Any


def _leaf(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["integer", "boolean", "enum", "string", "pattern", "array"])
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 500)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"type": "string", "enum": rng.sample(["red", "green", "blue", "def", "class", "None", "x"], 3)}
    if kind == "string":
        return {"type": "string", "minLength": 1, "maxLength": rng.randint(1, 12)}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice([r"^[a-z]{1,8}$", r"^[A-Z][a-z]{0,6}$", r"^\d{3}-\d{4}$",
                                                          r"^(foo|bar|baz)_[0-9]{1,2}$"])}
    return {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
            "minItems": rng.randint(0, 2), "maxItems": rng.randint(2, 4)}


def _object(rng: random.Random, depth: int) -> dict[str, Any]:
    names = rng.sample(["name", "id", "kind", "tags", "size", "ok", "code", "items", "meta", "path"], rng.randint(1, 4))
    props = {n: (_object(rng, depth + 1) if depth < 2 and rng.random() < 0.25 else _leaf(rng)) for n in names}
    return {"type": "object", "properties": props, "required": names, "additionalProperties": False}


def random_schemas(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` schemas; every fifth is an array of objects, the rest objects (some nested)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        obj = _object(rng, 0)
        out.append({"type": "array", "items": obj, "minItems": 1, "maxItems": 2} if i % 5 == 4 else obj)
    return out
