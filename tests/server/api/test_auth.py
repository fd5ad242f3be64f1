"""The key is checked before the body is read (issue 35): a request without the key its path
needs is refused with no byte of its body received by the app, so it costs the server no parse.

An outermost ASGI layer counts the body bytes the app pulls through ``receive``, per request:
a refused request must pull none; the same request with the key must pull all of it (the
counter works). Real uvicorn, real Redis, the hf engine on the tiny model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gspo_rl.server.api.app import create_app
from gspo_rl.server.config import ServerSettings
from tests.conftest import RedisServer
from tests.helpers.serving import ADMIN_KEY, API_KEY, MODEL_NAME, Served, serve_app

BIG_BODY = json.dumps([{"rollout_id": f"r{i:07d}", "reward": 0.5}
                       for i in range(190_000)]).encode()  # ~7.6 MiB, as in the issue
API = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"}
JSON = {"Content-Type": "application/json"}


class BodyCounter:
    """Outermost layer: the body bytes the app below received, per request path (the last
    request to each path)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.received: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        self.received[path] = 0

        async def counting() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.received[path] += len(message.get("body", b""))
            return message

        await self.app(scope, counting, send)


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, redis_mod: RedisServer) -> Iterator[tuple[Served, BodyCounter]]:
    settings = ServerSettings(model=str(tiny_model_dir), redis_url=redis_mod.url,
                              served_model_name=MODEL_NAME, api_key=API_KEY,
                              admin_key=ADMIN_KEY, device="cpu", admission=False,
                              server_id="auth-test")
    app = create_app(settings)
    counter: list[BodyCounter] = []

    def outermost(inner: ASGIApp) -> BodyCounter:
        counter.append(BodyCounter(inner))
        return counter[0]

    app.add_middleware(outermost)  # added last: outside every other layer
    with serve_app(app) as s:
        yield s, counter[0]


@pytest.mark.parametrize(("path", "headers", "status", "code"), [
    ("/v1/rewards", JSON, 401, "missing_api_key"),
    ("/v1/rewards", {**JSON, "Authorization": "Bearer wrong"}, 401, "invalid_api_key"),
    ("/v1/rewards", {**JSON, "Authorization": f"Basic {API_KEY}"}, 401, "missing_api_key"),
    ("/v1/rewards", {**JSON, "Authorization": f"Bearer {ADMIN_KEY}"}, 401, "invalid_api_key"),
    ("/v1/no-such-route", JSON, 401, "missing_api_key"),
    ("/admin/weights/update", API, 401, "invalid_api_key"),
    ("/admin/weights/update", JSON, 401, "missing_api_key"),
])
def test_a_refused_request_is_answered_before_its_body_is_read(
        served: tuple[Served, BodyCounter], path: str, headers: dict[str, str], status: int,
        code: str) -> None:
    s, counter = served
    with httpx.Client(base_url=s.url, timeout=60) as client:
        r = client.post(path, content=BIG_BODY, headers=headers)
        assert r.status_code == status, r.text[:300]
        assert r.json()["error"]["code"] == code
        assert r.json()["error"]["type"] == "authentication_error"
        assert r.headers["www-authenticate"] == "Bearer"
        assert counter.received[path] == 0, "the app received the body of a refused request"
        # The connection the refused body was sent on still serves the next request.
        assert client.get("/health").status_code == 200


def test_with_the_key_the_body_is_read(served: tuple[Served, BodyCounter]) -> None:
    """The same body with the key is read whole (and answered: none of its rollouts exist),
    so the counter above can see a body being read."""
    s, counter = served
    r = httpx.post(f"{s.url}/v1/rewards", content=BIG_BODY, headers=API, timeout=120)
    assert r.status_code == 422, r.text[:300]  # over MAX_REWARDS_PER_CALL items
    assert counter.received["/v1/rewards"] == len(BIG_BODY)
    small = {"rollout_id": "nope", "reward": 1.0}
    r = httpx.post(f"{s.url}/v1/rewards", json=small, headers=API, timeout=30)
    assert r.status_code == 404 and counter.received["/v1/rewards"] > 0


def test_open_routes_need_no_key(served: tuple[Served, BodyCounter]) -> None:
    s, _ = served
    for path in ("/health", "/metrics", "/openapi.json"):
        assert httpx.get(f"{s.url}{path}", timeout=30).status_code == 200, path


def test_the_openapi_document_keeps_the_security_scheme(
        served: tuple[Served, BodyCounter]) -> None:
    doc = httpx.get(f"{served[0].url}/openapi.json", timeout=30).json()
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, item in doc["paths"].items():
        for op in item.values():
            guarded = path.startswith(("/v1", "/admin"))
            assert bool(op.get("security")) == guarded, path
            assert ("401" in op["responses"]) == guarded, path
