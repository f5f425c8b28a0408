"""Every error becomes a readable 4xx JSON body (503 while the database is unreachable); a 500
is a bug and says so without details."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from aicluster.core import ConfigError, IllegalTransition
from aicluster.store import AuthenticationError, Conflict, NotFound, StoreError

__all__ = ["install_error_handlers"]

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


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, error: RequestValidationError) -> JSONResponse:
        message, problems = _validation_message(error)
        return _error(422, message, problems=problems)

    @app.exception_handler(StarletteHTTPException)
    async def http(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": str(error.detail)}, status_code=error.status_code, headers=error.headers
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
