"""The control endpoints that move decoding requests between decode units of a running deployment."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from disaggsdk.serve.http.client_request_ids import public_request_id
from disaggsdk.serve.http.error_bodies import BadRequestError
from disaggsdk.serve.http.openai_json import decode_body
from disaggsdk.serve.moves.request_moves import LeverConflict, MoveError

if TYPE_CHECKING:
    from disaggsdk.serve.backend import LaunchedUnits, ServingBackend

MAX_DRAIN_TIMEOUT_S = 600.0
MOVE_TIMEOUT_S = 60.0  # one move: the KV of one request over the fabric, far below this


def refusal(exc: MoveError, param: str | None) -> BadRequestError:
    """The OpenAI error a lever's refusal answers: 409 when the deployment's state refuses it, else 400."""
    if isinstance(exc, LeverConflict):
        return BadRequestError(str(exc), param=param, status=409)
    return BadRequestError(str(exc), param=param)


def add_unit_control_routes(app: FastAPI, backend: ServingBackend, check_key: Callable[[Request], Awaitable[None]],
                            body_of: Callable[[Request], Awaitable[bytes]]) -> None:
    """Add the drain, undrain and move endpoints to ``app`` (``body_of``: the app's bounded body reader)."""

    async def json_object(request: Request) -> dict[str, object]:
        raw = await body_of(request)
        body = decode_body(raw) if raw.strip() else {}
        if not isinstance(body, dict):
            raise BadRequestError("the body must be a JSON object")
        return body

    def router() -> LaunchedUnits:
        units = backend.units()
        if units is None:
            raise BadRequestError("this deployment is one engine in one process: it has no units to move requests "
                                  "between", status=400)
        return units

    @app.post("/units/{unit}/drain", dependencies=[Depends(check_key)])
    async def drain(unit: str, request: Request) -> JSONResponse:
        body = await json_object(request)
        timeout_s = body.get("timeout_s", 60.0)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not 0 < timeout_s <= MAX_DRAIN_TIMEOUT_S:
            raise BadRequestError(f"'timeout_s' must be a number of seconds in (0, {MAX_DRAIN_TIMEOUT_S:g}]",
                                  param="timeout_s")
        r = router()
        try:  # it waits for the moves: off the event loop, which must keep streaming their tokens
            report = await run_in_threadpool(r.drain, unit, float(timeout_s))
        except MoveError as exc:
            raise refusal(exc, "unit") from None
        # each request by its response id: its key never leaves the server (`client_request_ids`)
        moves = [dataclasses.asdict(o) | {"request_id": public_request_id(o.request_id),
                                          "reason": o.reason.replace(o.request_id, public_request_id(o.request_id))}
                 for o in report.moves]
        return JSONResponse({"unit": unit, "drained": report.drained,
                             "remaining": [public_request_id(k) for k in report.remaining],
                             "routed": report.routed, "moves": moves})

    @app.post("/units/{unit}/undrain", dependencies=[Depends(check_key)])
    def undrain(unit: str) -> JSONResponse:
        r = router()
        if unit not in r.unit_roles():
            raise BadRequestError(f"no unit {unit!r} in this deployment", param="unit", status=404)
        r.undrain(unit)
        return JSONResponse({"unit": unit, "routed": True})

    @app.post("/rebalance", dependencies=[Depends(check_key)])
    async def rebalance_units(request: Request) -> JSONResponse:
        from disaggsdk.serve.moves.rebalance import rebalance

        body = await json_object(request)
        prefill, decode = body.get("prefill"), body.get("decode")
        if isinstance(prefill, bool) or isinstance(decode, bool) or not isinstance(prefill, int) \
                or not isinstance(decode, int):
            raise BadRequestError("'prefill' and 'decode' must be whole numbers of units", param="prefill")
        r = router()
        try:  # drains and role changes take seconds: off the event loop, which streams the moved requests
            report = await run_in_threadpool(rebalance, r, prefill, decode)
        except MoveError as exc:
            raise refusal(exc, "prefill") from None
        return JSONResponse({"done": report.done, "roles": report.roles,
                             "changes": [dataclasses.asdict(c) for c in report.changes]})

    @app.post("/requests/{request_id}/move", dependencies=[Depends(check_key)])
    async def move(request_id: str, request: Request) -> JSONResponse:
        body = await json_object(request)
        target = body.get("to")
        if not isinstance(target, str):
            raise BadRequestError("'to' must name the decode unit to move the request to", param="to")
        r = router()
        try:
            outcome = r.move(request_id, target)
        except MoveError as exc:
            raise refusal(exc, "to" if "unit" in str(exc) else None) from None
        result = await run_in_threadpool(outcome.result, MOVE_TIMEOUT_S)
        # named as the caller named it: the outcome's id is the request's key, which never leaves the server
        named = {"request_id": request_id, "reason": result.reason.replace(result.request_id, request_id)}
        return JSONResponse(dataclasses.asdict(result) | named)
