"""Fuzzing the HTTP API from its OpenAPI document (hypothesis; bounded to well under a minute).

Bodies are drawn from each route's request schema in ``docs/openapi.json`` (the committed
document, which ``test_openapi`` keeps equal to the code) with hostile values mixed in at any
node (``tests.helpers.openapi_fuzz``). Against the real app under uvicorn, real Redis and the hf
engine on the tiny model, every answer must be: not a 5xx other than a documented 503, within the
client's timeout (no hang), a status the document lists for the route, and a body matching the
document's schema for that status (the route's model for a 200, the error body otherwise).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scripts.export_openapi import OUT
from tests.conftest import RedisServer
from tests.helpers.openapi_fuzz import HOSTILE, body_strategy, conforms
from tests.helpers.serving import API_KEY, MODEL_NAME, Served, running_server

DOC: dict[str, Any] = json.loads(OUT.read_text())
AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
REQUEST_TIMEOUT_S = 30.0
FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
# Small values for the fields that decide the cost of a request, so most bodies that pass
# validation also generate (cheaply) and reach the code after the engine.
OVERRIDES: dict[str, Any] = {
    "model": st.sampled_from([MODEL_NAME, MODEL_NAME, MODEL_NAME, "other-model"]),
    "n": st.integers(1, 2) | HOSTILE,
    "max_tokens": st.integers(1, 3) | HOSTILE,
    "max_completion_tokens": st.none() | st.integers(1, 3),
    "prompt_token_ids": st.lists(st.integers(0, 1100), min_size=1, max_size=5) | HOSTILE,
    "stream": st.none() | st.just(False),
    "rollout_id": st.none() | st.text(max_size=8),
}
SCHEMA_FOR = {
    "/v1/chat/completions": "ChatCompletionRequest",
    "/v1/completions": "CompletionRequest",
    "/v1/rollouts": "RolloutRequest",
    "/v1/groups": "OpenGroupIn",
}


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, redis_mod: RedisServer) -> Iterator[Served]:
    with running_server(tiny_model_dir, redis_mod.url, max_tokens=3, max_n=2) as s:
        yield s


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers=AUTH, timeout=REQUEST_TIMEOUT_S) as c:
        yield c


def check_answer(r: httpx.Response, path: str, method: str) -> None:
    """The status is documented for the operation and the body matches its schema."""
    op = DOC["paths"][path][method]
    assert r.status_code < 500 or r.status_code == 503, (r.status_code, r.text[:300])
    assert str(r.status_code) in op["responses"], (
        f"{method.upper()} {path} answered {r.status_code}, not in the document "
        f"({sorted(op['responses'])}): {r.text[:300]}")
    schema = op["responses"][str(r.status_code)]["content"]["application/json"]["schema"]
    problem = conforms(DOC, schema, r.json())
    assert problem is None, f"{method.upper()} {path} {r.status_code}: {problem}: {r.text[:300]}"


def post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    # allow_nan: NaN/Infinity go out as the literals a hostile client would send;
    # ensure_ascii: lone surrogates go out as \\udXXX escapes (the JSON way to send them).
    content = json.dumps(body, allow_nan=True, ensure_ascii=True)
    return client.post(path, content=content)


def _request_schema(path: str) -> dict[str, Any]:
    return DOC["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


@pytest.mark.parametrize("path", list(SCHEMA_FOR))
def test_fuzz_post_routes(client: httpx.Client, path: str) -> None:
    assert _request_schema(path)["$ref"].endswith(SCHEMA_FOR[path])

    @FUZZ
    @given(body=body_strategy(DOC, _request_schema(path), OVERRIDES))
    def run(body: Any) -> None:
        check_answer(post(client, path, body), path, "post")

    run()
    assert client.get("/health").status_code == 200


def test_fuzz_rewards(client: httpx.Client) -> None:
    path = "/v1/rewards"

    @FUZZ
    @given(body=body_strategy(DOC, _request_schema(path), OVERRIDES))
    def run(body: Any) -> None:
        check_answer(post(client, path, body), path, "post")

    run()


def test_fuzz_get_group(client: httpx.Client) -> None:
    path = "/v1/groups/{group_id}"
    # "/" (even escaped) and dot segments are routing, not ids: uvicorn decodes the path.
    ids = st.text(min_size=1, max_size=300).filter(lambda s: "/" not in s and s not in (".", ".."))

    @FUZZ
    @given(group_id=ids)
    def run(group_id: str) -> None:
        try:
            url = "/v1/groups/" + quote(group_id, safe="")
        except UnicodeEncodeError:  # a lone surrogate cannot even be put in a URL
            return
        check_answer(client.get(url), path, "get")

    run()
