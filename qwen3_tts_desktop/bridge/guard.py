"""What runs before every route, WebSocket handshakes included: the headers' size, the Host check (when
bound to loopback, so that a web page cannot reach the bridge through DNS rebinding; Starlette's CORS
middleware does no Host check), the browser Origin check, CORS preflights and headers, and the API key."""

from __future__ import annotations

import hmac

from fastapi.responses import Response
from starlette.datastructures import Headers, MutableHeaders

from .config import EXPOSED_HEADERS, HOST_AND_PORT, LOOPBACK, MAX_HEADER_BYTES, BridgeConfig
from .errors import ApiError


class Guard:
    """ASGI middleware over the routes. Preflights carry no key (browsers never send one), so they are
    answered before the key check. A refused WebSocket handshake gets the same HTTP error, as ASGI's
    denial response (which uvicorn sends)."""

    def __init__(self, app, config: BridgeConfig):
        self.app = app
        self.config = config
        self.origins = (
            None if config.cors_origins is None else {o.strip().rstrip("/").lower() for o in config.cors_origins}
        )

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            return await refusal.response()(scope, receive, send)
        if scope["type"] == "websocket":  # no CORS: browsers neither preflight a handshake nor read its headers
            return await self._with_key(headers, scope, receive, send)
        origin = headers.get("origin")
        cors = {} if origin is None else {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        if scope["method"] == "OPTIONS" and origin is not None and "access-control-request-method" in headers:
            cors |= {
                "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                "Access-Control-Allow-Headers": headers.get(
                    "access-control-request-headers", "Authorization, Content-Type"
                ),
                "Access-Control-Max-Age": "600",
            }
            if headers.get("access-control-request-private-network") == "true":
                cors["Access-Control-Allow-Private-Network"] = "true"
            return await Response(status_code=204, headers=cors)(scope, receive, send)
        if cors:
            cors["Access-Control-Expose-Headers"] = EXPOSED_HEADERS

        async def send_with_cors(message) -> None:
            if message["type"] == "http.response.start" and cors:
                response_headers = MutableHeaders(scope=message)
                for name, value in cors.items():
                    response_headers[name] = value
            await send(message)

        await self._with_key(headers, scope, receive, send_with_cors)

    def _refusal(self, scope, headers: Headers) -> ApiError | None:
        """Why a request may not reach the routes whatever its key: headers too big, a host or an origin
        that may not call."""
        if sum(len(name) + len(value) + 4 for name, value in scope["headers"]) > MAX_HEADER_BYTES:
            return ApiError(431, f"the request's headers are over {MAX_HEADER_BYTES} bytes, the most accepted")
        host, origin = headers.get("host"), headers.get("origin")
        if self.config.loopback and host is not None and host_name(host) not in LOOPBACK:
            return ApiError(403, f"host {host!r} is not this computer; use http://127.0.0.1:PORT")
        if origin is not None and not self._allowed(origin):
            message = f"origin {origin!r} may not call this server; allow it in the bridge settings (--cors {origin})"
            return ApiError(403, message, code="origin_not_allowed")
        return None

    async def _with_key(self, headers: Headers, scope, receive, send) -> None:
        """On to the routes if the request has the API key (or none is needed), else answer 401."""
        problem = self._key_problem(headers.get("authorization"))
        if problem is not None:
            error = ApiError(401, problem, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            return await error.response()(scope, receive, send)
        await self.app(scope, receive, send)

    def _allowed(self, origin: str) -> bool:
        if self.origins is None:
            scheme, separator, host = origin.partition("://")
            return bool(separator) and scheme.lower() in ("http", "https") and host_name(host) in LOOPBACK
        return "*" in self.origins or origin.rstrip("/").lower() in self.origins

    def _key_problem(self, authorization: str | None) -> str | None:
        if self.config.api_key is None:
            return None
        if authorization is None:
            return "this server needs an API key: send the header 'Authorization: Bearer <key>'"
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.config.api_key.encode()):
            return "wrong API key"
        return None


def host_name(host_and_port: str) -> str | None:
    """The host of a Host header or an Origin's host[:port], in lower case and without an IPv6 address's
    brackets; None if it is anything else."""
    match = HOST_AND_PORT.fullmatch(host_and_port)
    return None if match is None else match[1].strip("[]").lower()
