"""The security-headers middleware in front of a crashing route (no broker needed)."""

from __future__ import annotations

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from workers.answering.web.app import SecurityHeaders


async def crash(request: Request) -> Response:
    raise ValueError("a bug")


async def test_a_crash_is_a_coded_500_with_the_security_headers() -> None:
    app = Starlette(routes=[Route("/api/crash", crash)])
    app.add_middleware(SecurityHeaders)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get("/api/crash")
    assert response.status_code == 500
    assert response.json() == {"name": "WebError", "code": "INTERNAL", "message": "internal error; see the server log"}
    assert "a bug" not in response.text  # no traceback to the client
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert response.headers["cache-control"] == "no-store"
