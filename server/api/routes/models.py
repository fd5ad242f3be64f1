"""``GET /v1/models``: the OpenAI-compatible list of served models (one: ``served_model_name``).

OpenAI-compatible tools ask for it first (the openai client's ``models.list()``); vLLM adds
``root`` and ``max_model_len``, and so does this server, with the weights' ``policy_version``.
``GET /v1/models/{model}`` retrieves one (404 ``model_not_found`` for another name).
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel

from gspo_rl.server.api.deps import EngineDep, SettingsDep
from gspo_rl.server.api.error_docs import error_responses
from gspo_rl.server.api.errors import APIError
from gspo_rl.server.config import ServerSettings
from gspo_rl.server.engines.base import Engine

router = APIRouter(tags=["models"])


class ModelCard(BaseModel):
    id: str
    """The name requests pass as ``model`` (``served_model_name``)."""
    object: Literal["model"] = "model"
    created: int
    """When this server started (Unix seconds)."""
    owned_by: str = "gspo-rl"
    root: str
    """The model directory the engine loaded."""
    max_model_len: int
    """The context the engine serves (prompt plus completion tokens)."""
    policy_version: int
    """Extension: the version of the weights being served."""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def _card(settings: ServerSettings, engine: Engine, created: int) -> ModelCard:
    return ModelCard(id=settings.model_name, created=created, root=engine.model_path,
                     max_model_len=engine.max_model_len, policy_version=engine.policy_version)


@router.get("/v1/models", response_model=ModelList, responses=error_responses(401))
async def list_models(request: Request, settings: SettingsDep, engine: EngineDep) -> ModelList:
    """The model this server serves."""
    return ModelList(data=[_card(settings, engine, request.app.state.started_at)])


@router.get("/v1/models/{model}", response_model=ModelCard,
            responses=error_responses(401, 404, 422))
async def retrieve_model(model: str, request: Request, settings: SettingsDep,
                         engine: EngineDep) -> ModelCard:
    """One model by name: this server's, or 404."""
    if model != settings.model_name:
        raise APIError(404, f"model {model!r} not found: this server serves "
                            f"{settings.model_name!r}", code="model_not_found")
    return _card(settings, engine, request.app.state.started_at)
