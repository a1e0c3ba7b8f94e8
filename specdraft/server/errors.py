"""Errors in OpenAI's format, ``{"error": {"message", "type", "param", "code"}}``, and the
handlers that turn FastAPI's own errors (validation, unknown route) into that format."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class APIError(Exception):
    """An error a client caused; raised anywhere below a route, answered by :func:`add_error_handlers`."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.param, self.code)


def error_response(status: int, message: str, type_: str = "invalid_request_error", param=None,
                   code=None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status)


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """400 naming the first invalid field (``messages.0.role: ...``), or the body that is not JSON."""
    err = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    if err.get("type") == "json_invalid":
        return error_response(400, "the request body is not valid JSON")
    msg = err.get("msg", "invalid request").removeprefix("Value error, ")  # (pydantic's words for a validator's ValueError)
    param = ".".join(loc) or None
    return error_response(400, f"{param}: {msg}" if param else msg, param=param)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(exc.status_code, str(exc.detail),
                          "not_found_error" if exc.status_code == 404 else "invalid_request_error")


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return exc.response()


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(APIError, _api_error)
