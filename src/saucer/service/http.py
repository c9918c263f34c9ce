"""Small helpers of the service's HTTP API: JSON answers, error bodies, query parameters."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from saucer.service.protocol import ErrorCode

__all__ = ["json_response", "error_response", "unauthorized", "float_param"]


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``data`` as a JSON response."""
    return Response(orjson.dumps(data), status_code=status, media_type="application/json", headers=headers)


def error_response(status: int, code: str, message: str) -> Response:
    """``{"error": {"code", "message"}}`` with ``status`` (and ``WWW-Authenticate`` on 401)."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return json_response({"error": {"code": code, "message": message}}, status, headers)


def unauthorized() -> Response:
    """The answer to a missing or wrong bearer token."""
    return error_response(401, ErrorCode.UNAUTHORIZED, "missing or invalid bearer token")


def float_param(request: Request, name: str, default: float, maximum: float) -> float:
    """Query parameter ``name`` as a number clamped to ``[0, maximum]``; ``default`` when absent or not a number."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return max(0.0, min(value, maximum))
