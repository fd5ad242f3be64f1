"""The OpenAPI document lists every status each route can answer, with the error body's schema
(issue 11: it listed only 200/422 for routes that answer 400/401/404/409/413/503). What the
routes actually answer is exercised by ``test_fuzz_api`` (every answer must be documented)."""

from __future__ import annotations

from typing import Any

import pytest

from gspo_rl.server.api.app import create_app
from gspo_rl.server.config import ServerSettings

V1_POST = {"200", "400", "401", "413", "422", "503"}
EXPECTED: dict[tuple[str, str], set[str]] = {
    ("post", "/v1/chat/completions"): V1_POST | {"404", "409", "410", "501"},
    ("post", "/v1/completions"): V1_POST | {"404"},
    ("post", "/v1/rollouts"): V1_POST | {"404"},
    ("post", "/v1/rewards"): V1_POST | {"404", "409", "410"},
    ("post", "/v1/groups"): V1_POST | {"501"},
    ("get", "/v1/groups/{group_id}"): {"200", "401", "404", "422", "503"},
    ("post", "/v1/groups/{group_id}/abandon"): V1_POST | {"404"},
    ("post", "/admin/weights/update"): {"200", "400", "401", "403", "409", "413", "422", "504"},
    ("post", "/admin/weights/join"): {"200", "400", "401", "403", "413", "422", "504"},
    ("post", "/admin/pause"): {"200", "401", "403"},
    ("get", "/health"): {"200", "503"},
}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return create_app(ServerSettings(model="MODEL", served_model_name="MODEL")).openapi()


@pytest.mark.parametrize(("method", "path"), list(EXPECTED))
def test_route_documents_its_statuses(doc: dict[str, Any], method: str, path: str) -> None:
    responses = doc["paths"][path][method]["responses"]
    assert EXPECTED[(method, path)] <= set(responses), sorted(responses)
    for status, response in responses.items():
        if status.startswith(("4", "5")) and path != "/health":
            schema = response["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (status, schema)


def test_error_body_schema_is_the_one_served(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas  # the server never answers {"detail": [...]}
    error = schemas["ErrorDetail"]
    assert set(error["required"]) == {"message", "type"}
    assert schemas["ErrorResponse"]["required"] == ["error"]
