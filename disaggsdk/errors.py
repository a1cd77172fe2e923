"""Typed errors a user can act on. Each message says what is wrong and how to fix it."""

from __future__ import annotations


class DisaggError(Exception):
    """Base class of every error disaggsdk raises on purpose."""


class SpecError(DisaggError):
    """A deployment spec is malformed or inconsistent.

    Attributes:
        problems: every problem found, each as "<yaml path>: <what is wrong and how to fix it>".
    """

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class ModelError(DisaggError):
    """A model name or checkpoint directory cannot be used (unknown name, bad config.json, missing weights)."""


def printable(text: str) -> str:
    """``text`` as it is when every character of it prints, else its Python repr: a file name or value
    a user gave can go into a message and leave it one line (a newline in a path would start another)."""
    return text if text.isprintable() else repr(text)
