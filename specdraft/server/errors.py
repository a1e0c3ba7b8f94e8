"""Errors in OpenAI's format, ``{"error": {"message", "type", "param", "code"}}`` (under
/v1/messages, Anthropic's API: ``{"type": "error", "error": {"type", "message"}}``), and the
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

    def response(self, path: str = "") -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.param, self.code, path)


ANTHROPIC_PATH = "/v1/messages"  # Anthropic's Messages API (server.messages_api): its own error shape
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                   413: "request_too_large", 429: "rate_limit_error"}


def error_response(status: int, message: str, type_: str = "invalid_request_error", param=None,
                   code=None, path: str = "") -> JSONResponse:
    """The error's JSON response, in the shape of the API ``path`` belongs to."""
    if path.startswith(ANTHROPIC_PATH):
        return JSONResponse(anthropic_error(status, message), status_code=status)
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status)


def anthropic_error(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """400 naming the first invalid field (``messages.0.role: ...``), or the body that is not JSON."""
    err = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    path = request.url.path
    if err.get("type") == "json_invalid":
        return error_response(400, "the request body is not valid JSON", path=path)
    msg = err.get("msg", "invalid request").removeprefix("Value error, ")  # (pydantic's words for a validator's ValueError)
    param = ".".join(loc) or None
    return error_response(400, f"{param}: {msg}" if param else msg, param=param, path=path)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(exc.status_code, str(exc.detail),
                          "not_found_error" if exc.status_code == 404 else "invalid_request_error",
                          path=request.url.path)


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return exc.response(request.url.path)


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(APIError, _api_error)
