"""Every error becomes a readable 4xx JSON body (503 while the database is unreachable); a 500
is a bug and says so without details."""

from __future__ import annotations

import json
import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aicluster.core import ConfigError, IllegalTransition
from aicluster.store import AuthenticationError, Conflict, NotFound, StoreError

__all__ = ["ReadableErrors", "install_error_handlers"]

log = logging.getLogger(__name__)


def _error(status: int, message: str, **extra: object) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def _validation_message(error: RequestValidationError) -> tuple[str, list[dict[str, object]]]:
    problems = []
    for item in error.errors():
        location = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
        problems.append({"field": location or "body", "message": item.get("msg", "invalid")})
    first = problems[0] if problems else {"field": "body", "message": "invalid request"}
    return f"{first['field']}: {first['message']}", problems


def _http_message(request: Request, error: StarletteHTTPException) -> str:
    """The detail of an HTTPException; the router's bare "Not Found" and "Method Not Allowed"
    (a path or a method no route has) say which, and what to do instead."""
    detail, path = str(error.detail), request.url.path
    if error.status_code == 404 and detail == "Not Found":
        return f"no such path: {path} (the API's routes are listed at /docs)"
    if error.status_code == 405 and detail == "Method Not Allowed":
        allowed = (error.headers or {}).get("Allow", "")
        return f"{request.method} is not allowed on {path}" + (
            f" (allowed: {allowed})" if allowed else ""
        )
    return detail


class ReadableErrors:
    """Every 4xx carries the API's error body, ``{"error": ...}``, whoever made it: a 4xx with
    an empty body (none of the API's handlers makes one, but a route or middleware that answers
    ``Response(status_code=4xx)`` would) gets the status's own words. Answers to HEAD keep no
    body, as HTTP says."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "HEAD":
            await self.app(scope, receive, send)
            return
        held: Message | None = None

        async def readable(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and 400 <= message["status"] < 500:
                held = message  # until the body shows whether it is empty
                return
            if held is not None and message["type"] == "http.response.body":
                start, held = held, None
                if not message.get("body") and not message.get("more_body", False):
                    await _send_error(send, start)
                    return
                await send(start)
            await send(message)

        await self.app(scope, receive, readable)


async def _send_error(send: Send, start: Message) -> None:
    status = int(start["status"])
    body = json.dumps({"error": HTTPStatus(status).phrase.lower()}).encode()
    kept = [
        (name, value)
        for name, value in start.get("headers", [])
        if name.lower() not in (b"content-length", b"content-type")
    ]
    headers = [
        *kept,
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
    ]
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, error: RequestValidationError) -> JSONResponse:
        message, problems = _validation_message(error)
        return _error(422, message, problems=problems)

    @app.exception_handler(StarletteHTTPException)
    async def http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": _http_message(request, error)},
            status_code=error.status_code,
            headers=error.headers,
        )

    @app.exception_handler(ConfigError)
    async def bad_spec(_: Request, error: ConfigError) -> JSONResponse:
        # A spec that would run something else than its shipped code (-c, an absolute path,
        # '..') is refused as a bad request; other invalid fields are unprocessable.
        return _error(400 if getattr(error, "unsafe", False) else 422, str(error))

    @app.exception_handler(IllegalTransition)
    async def illegal(_: Request, error: IllegalTransition) -> JSONResponse:
        return _error(409, str(error))

    @app.exception_handler(StoreError)
    async def store(_: Request, error: StoreError) -> JSONResponse:
        if isinstance(error, NotFound):
            return _error(404, str(error) or "not found")
        if isinstance(error, AuthenticationError):
            return _error(401, "missing or invalid bearer token")
        if isinstance(error, Conflict):
            return _error(409, str(error))
        return _error(400, str(error))

    # Validation keeps malformed values out of the database; these catch what slips past, and
    # races between servers, without showing SQL to the caller.
    @app.exception_handler(IntegrityError)
    async def integrity(request: Request, error: IntegrityError) -> JSONResponse:
        log.warning("integrity error on %s %s: %s", request.method, request.url.path, error.orig)
        return _error(409, "the request conflicts with a concurrent change; retry it")

    @app.exception_handler(DataError)
    async def data(request: Request, error: DataError) -> JSONResponse:
        log.warning("data error on %s %s: %s", request.method, request.url.path, error.orig)
        return _error(422, "a value in the request cannot be stored")

    @app.exception_handler(OperationalError)
    async def unavailable(request: Request, error: OperationalError) -> JSONResponse:
        log.error("database error on %s %s: %s", request.method, request.url.path, error.orig)
        response = _error(503, "the database is unavailable; retry shortly")
        response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(ValueError)
    async def value(_: Request, error: ValueError) -> JSONResponse:
        return _error(400, str(error))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(500, "internal error (logged on the server)")
