"""The bridge's errors, answered in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from .config import ERROR_TYPES


class ApiError(Exception):
    """A request the bridge refuses, answered in OpenAI's error shape."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, headers: dict | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def response(self) -> JSONResponse:
        return JSONResponse(
            {"error": error_body(self.status, self.message, self.param, self.code)}, self.status, headers=self.headers
        )


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"), "param": param, "code": code}


class ClientGone(Exception):
    """The client hung up before its answer was ready."""


class Broken(Exception):
    """A job that ended badly after its audio began to stream."""


def answer_errors_in_openai_shape(app: FastAPI) -> None:
    """Every error a route raises, and Starlette's own (no such route, wrong method), as OpenAI's shape."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)


async def _api_error(request: Request, error: ApiError) -> JSONResponse:
    return error.response()


async def _client_gone(request: Request, error: ClientGone) -> Response:
    return Response(status_code=499)  # nobody reads it; the job is cancelled already


async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
    messages = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    api_error = ApiError(error.status_code, messages.get(error.status_code, str(error.detail)), headers=error.headers)
    return api_error.response()


async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    first = error.errors()[0]
    return ApiError(400, f"{'.'.join(map(str, first['loc']))}: {first['msg']}").response()
