"""The one error the OpenAI front end answers with: a status, a message and the field at fault.

Raised wherever a request is refused (body, fields, backend refusal) and rendered once, in
OpenAI's error shape, so every client sees the same ``{"error": {...}}`` body.
"""

from __future__ import annotations

from typing import Any

from disaggsdk.errors import DisaggError


class BadRequestError(DisaggError):
    """A request the server refuses. ``param`` names the offending field (OpenAI's ``param``)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.param = param
        self.status = status
        self.kind = kind

    def body(self) -> dict[str, Any]:
        """The OpenAI-style JSON error body."""
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.status}}
