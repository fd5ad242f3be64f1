"""The OpenAPI document says exactly what the server accepts (issue 35).

Against the real app (uvicorn, Redis, the hf engine on the tiny model) and the document it
serves (``/openapi.json``, with its own limits: ``gspo_rl.server.api.openapi``):

- the requests the issue found refused although the document allowed them, and one it allowed
  by coercion (``"n": "2"``): each is valid for the document exactly when the server takes it
  (2xx, or 404/409: a state the document cannot know, an unknown rollout), and refused with a
  4xx when it is not;
- schemathesis (its ``run`` command, as a user runs it) with positive and negative data, every
  check: schema-valid requests accepted, schema-violating ones rejected, every answer
  documented and matching its schema, the key enforced.

What no schema can say is kept out of reach, not out of the checks: the context of this
model is raised to 8,192 positions (a generated chat can render to 2,000 tokens; the
server's 400 for a longer prompt is tested in test_errors), and bodies stay under the default
``max_body_bytes``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from tests.conftest import RedisServer
from tests.helpers.serving import API_KEY, MODEL_NAME, Served, running_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CONTEXT = 8192
SCHEMATHESIS_CONFIG = """
[checks.negative_data_rejection]
# 413: a body over max_body_bytes (e.g. more than 1,024 rewards) is a rejection too
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422",
                     "428", "429", "5xx"]
"""


@pytest.fixture(scope="module")
def long_context_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with room for long generated prompts (rotary positions: any length)."""
    out = tmp_path_factory.mktemp("tiny-long") / "tiny"
    shutil.copytree(tiny_model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["max_position_embeddings"] = CONTEXT
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def served(long_context_model: Path, redis_mod: RedisServer) -> Iterator[Served]:
    with running_server(long_context_model, redis_mod.url, max_tokens=3, max_n=2,
                        max_body_bytes=8 * 1024 * 1024, max_ready_groups=0) as s:
        yield s


@pytest.fixture(scope="module")
def doc(served: Served) -> dict[str, Any]:
    return httpx.get(f"{served.url}/openapi.json", timeout=30).json()


def request_schema_valid(doc: dict[str, Any], path: str, body: Any) -> bool:
    ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    validator = jsonschema.Draft202012Validator({**ref, "components": doc["components"]})
    return validator.is_valid(body)


def _rollout(served: Served) -> str:
    r = httpx.post(f"{served.v1}/rollouts", json={"prompt": "a", "n": 1}, headers=AUTH,
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["rollouts"][0]["rollout_id"]


CASES: list[tuple[str, str, Any]] = [
    # a seed bound written as a float that lost its precision
    ("seed -2^63", "/v1/rollouts", {"prompt": "a", "seed": -(2**63)}),
    ("seed -2^63 - 1", "/v1/rollouts", {"prompt": "a", "seed": -(2**63) - 1}),
    ("seed at its upper bound", "/v1/rollouts", {"prompt": "a", "seed": 2**63 - 2**16}),
    # a message whose role needs content
    ("tool message without content", "/v1/rollouts", {"messages": [{"role": "tool"}]}),
    ("assistant message without content", "/v1/rollouts",
     {"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]}),
    ("empty completions prompt", "/v1/completions", {"model": MODEL_NAME, "prompt": ""}),
    ("empty token-id prompt", "/v1/completions", {"model": MODEL_NAME, "prompt": []}),
    ("two prompts", "/v1/completions", {"model": MODEL_NAME, "prompt": ["a", "b"]}),
    ("group size over the maximum", "/v1/groups", {"size": 4097}),
    ("group size at the maximum of this server", "/v1/groups", {"size": 4096}),
    ("messages and prompt_token_ids", "/v1/rollouts",
     {"messages": [{"role": "user", "content": "x"}], "prompt_token_ids": [1]}),
    ("metadata integer past int64", "/v1/rollouts", {"prompt": "a", "metadata": {"x": 2**63}}),
    ("metadata integer at int64's end", "/v1/rollouts",
     {"prompt": "a", "metadata": {"x": 2**63 - 1}}),
    ("metadata float past int64", "/v1/rollouts", {"prompt": "a", "metadata": {"x": 1e19}}),
    ("n as a string", "/v1/rollouts", {"prompt": "a", "n": "2"}),
    ("n as a boolean", "/v1/rollouts", {"prompt": "a", "n": True}),
    ("n as 2.0 (JSON's integer 2)", "/v1/rollouts", {"prompt": "a", "n": 2.0}),
    ("n over this server's max_n", "/v1/rollouts", {"prompt": "a", "n": 3}),
    ("max_tokens over the limit beside max_completion_tokens", "/v1/chat/completions",
     {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
      "max_completion_tokens": 2}),
    ("temperature too close to greedy", "/v1/rollouts", {"prompt": "a", "temperature": 1e-9}),
    ("a token id outside the vocabulary", "/v1/rollouts", {"prompt_token_ids": [10**6]}),
    ("another model", "/v1/completions", {"model": "other", "prompt": "a"}),
    ("tools without messages", "/v1/rollouts", {"prompt": "a", "tools": []}),
    ("top_logprobs without logprobs", "/v1/chat/completions",
     {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
]


@pytest.mark.parametrize(("what", "path", "body"), CASES, ids=[c[0] for c in CASES])
def test_the_document_says_what_the_server_takes(served: Served, doc: dict[str, Any],
                                                 what: str, path: str, body: Any) -> None:
    valid = request_schema_valid(doc, path, body)
    r = httpx.post(f"{served.url}{path}", json=body, headers=AUTH, timeout=60)
    if valid:  # taken (or a state the document cannot know: an unknown model or rollout)
        assert r.status_code < 300 or r.status_code in (404, 409), (what, r.text[:300])
    else:  # refused (schemathesis' rule: 404 for a model this server does not serve, too)
        assert r.status_code < 500 and r.status_code not in (200, 201), (what, r.text[:300])
        assert r.status_code >= 400


def test_a_turn_reward_count_the_rollout_cannot_have_is_a_conflict(
        served: Served, doc: dict[str, Any]) -> None:
    """Valid for the document (it cannot know the rollout's turns): a 409, not a 422."""
    body = {"rollout_id": _rollout(served), "reward": 1.0, "turn_rewards": [1.0, 0.0]}
    assert request_schema_valid(doc, "/v1/rewards", body)
    r = httpx.post(f"{served.v1}/rewards", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 409 and r.json()["error"]["code"] == "turn_count_mismatch", r.text


def test_the_served_document_has_this_servers_limits(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    rollout = schemas["RolloutRequest"]["properties"]
    assert rollout["n"]["maximum"] == 2 and rollout["max_tokens"]["maximum"] == 3
    assert rollout["prompt_token_ids"]["items"]["maximum"] == 1023  # the vocabulary
    assert schemas["ChatCompletionRequest"]["properties"]["model"]["enum"] == [MODEL_NAME]
    seed = rollout["seed"]["anyOf"][0]
    assert (seed["minimum"], seed["exclusiveMaximum"]) == (-(2**63), 2**63 - 2**16)


def test_schemathesis_positive_and_negative_checks_pass(served: Served,
                                                        tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    exe = Path(sys.executable).parent / "schemathesis"
    out = subprocess.run(
        [str(exe), "--config-file", str(config), "run", f"{served.url}/openapi.json",
         "--header", f"Authorization: Bearer {API_KEY}",
         "--include-path-regex", "^/(v1/|health$)", "--checks", "all", "--mode", "all",
         "--phases", "examples,coverage,fuzzing", "--max-examples", "8", "--seed", "1",
         "--workers", "1", "--request-timeout", "60", "--output-truncate", "true"],
        capture_output=True, text=True, timeout=540, cwd=tmp_path)  # its cache goes there
    report = out.stdout[-12000:] + out.stderr[-2000:]
    assert out.returncode == 0, report
    assert " passed" in out.stdout and "failed" not in out.stdout.split("SUMMARY")[-1], report
