"""Calling a running deployment's control endpoints (`serve.http.unit_control_routes`) from the command line."""

from __future__ import annotations

from disaggsdk.errors import DisaggError


class ControlError(DisaggError):
    """The deployment refused a control call, or could not be reached; the message says which and why."""


def post_control(url: str, path: str, body: dict[str, object], api_key: str | None, timeout_s: float) -> dict:
    """POST ``body`` to ``url + path`` and return the JSON answer.

    Raises:
        ControlError: the server is unreachable, or answered an error (its OpenAI error message is kept).
    """
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.post(url.rstrip("/") + path, json=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ControlError(f"cannot reach {url} ({exc}); is the deployment up?") from None
    try:
        answer = r.json()
    except ValueError:
        answer = {}
    if r.status_code != 200:
        message = answer.get("error", {}).get("message") if isinstance(answer, dict) else None
        raise ControlError(f"{url}{path}: HTTP {r.status_code}: {message or r.text[:200]}")
    return answer
