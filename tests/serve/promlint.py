"""`promtool check metrics` in Python: the Prometheus naming rules, plus ours, over a /metrics text.

The parser is prometheus_client's (`text_string_to_metric_families`); the rules are promtool's
lint (counters end in ``_total``, nothing else does, base units, no colons, HELP on every metric)
and the project's (units in names, no label Prometheus reserves for its own targets, histograms
whose buckets rise and add up).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

SNAKE_CASE = re.compile(r"^[a-z][a-z0-9_]*$")  # no colons: Prometheus keeps them for recording rules
RESERVED_LABELS = {"instance", "job"}  # set by Prometheus on every scraped target
UNIT_SUFFIXES = ("_seconds", "_bytes", "_tokens", "_pages", "_perc", "_ratio", "_info")
NON_BASE_UNITS = {"milliseconds", "microseconds", "nanoseconds", "minutes", "hours", "days", "kilobytes",
                  "megabytes", "gigabytes", "percent", "ms", "us", "ns", "sec", "secs", "msec", "usec",
                  "kb", "mb", "gb", "s", "m", "h", "d", "b"}
TYPE_WORDS = {"counter", "gauge", "histogram", "summary", "untyped"}
TIME_WORDS = {"time", "latency", "duration", "seconds"}
_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def _name_problems(name: str, kind: str) -> list[str]:
    problems = []
    if name.endswith("_created"):
        # prometheus_client's creation-time gauge of a counter or histogram (the classic text format
        # sends it as a family of its own): a timestamp named after its parent, whose name is checked
        return [] if SNAKE_CASE.match(name) else [f"{name}: metric names are snake_case"]
    if not SNAKE_CASE.match(name):
        problems.append(f"{name}: metric names are snake_case ([a-z0-9_], no colons)")
    words = set(name.split("_"))
    if words & NON_BASE_UNITS:
        problems.append(f"{name}: use base units (seconds, bytes), not {sorted(words & NON_BASE_UNITS)}")
    if words & TYPE_WORDS:
        problems.append(f"{name}: a metric name does not say its type")
    if kind != "counter" and name.endswith("_total"):
        problems.append(f"{name}: a {kind} must not end in _total (only counters do)")
    if kind == "histogram" and not name.endswith(UNIT_SUFFIXES):
        problems.append(f"{name}: a histogram's name ends in its unit ({', '.join(UNIT_SUFFIXES)})")
    if words & TIME_WORDS and not name.endswith("_seconds"):
        problems.append(f"{name}: a time is in seconds, and its name ends in _seconds")
    if "bytes" in words and not name.endswith("_bytes"):
        problems.append(f"{name}: a size in bytes ends in _bytes")
    return problems


def _histogram_problems(family) -> list[str]:
    series: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    counts: dict[tuple, float] = {}
    for s in family.samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        if s.name.endswith("_bucket"):
            series[key].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_count"):
            counts[key] = s.value
    problems = []
    for key, buckets in series.items():
        bounds = [le for le, _ in buckets]
        if any(b <= a for a, b in zip(bounds, bounds[1:])):
            problems.append(f"{family.name}{dict(key)}: bucket bounds must increase, got {bounds}")
        if not bounds or not math.isinf(bounds[-1]):
            problems.append(f"{family.name}{dict(key)}: the last bucket is le=+Inf")
        cumulative = [v for _, v in buckets]
        if any(b < a for a, b in zip(cumulative, cumulative[1:])):
            problems.append(f"{family.name}{dict(key)}: bucket counts are cumulative, got {cumulative}")
        if cumulative and counts.get(key) != cumulative[-1]:
            problems.append(f"{family.name}{dict(key)}: _count {counts.get(key)} != the +Inf bucket")
    return problems


def lint(exposition: str) -> list[str]:
    """Every rule the text breaks, one line each (empty: clean).

    Args:
        exposition: a Prometheus text-format page, as /metrics answers.
    Returns:
        the problems, naming the metric (and label set) at fault.
    """
    problems = []
    for family in text_string_to_metric_families(exposition):
        problems += _name_problems(family.name, family.type)
        if not family.documentation.strip():
            problems.append(f"{family.name}: no HELP text")
        for s in family.samples:
            for label in s.labels:
                if label in RESERVED_LABELS:
                    problems.append(f"{s.name}: label {label!r} is Prometheus' own target label")
                if not SNAKE_CASE.match(label):
                    problems.append(f"{s.name}: label {label!r} is not snake_case")
                if label == "le" and family.type != "histogram":
                    problems.append(f"{s.name}: only a histogram has the label 'le'")
            if family.type == "counter" and not s.name.endswith(("_total", "_created")):
                problems.append(f"{s.name}: a counter's samples end in _total")
            if family.type == "histogram" and not s.name.endswith(_HISTOGRAM_SUFFIXES):
                problems.append(f"{s.name}: not a histogram sample")
        if family.type == "histogram":
            problems += _histogram_problems(family)
    return sorted(set(problems))
