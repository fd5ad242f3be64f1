"""``GET /v1/models``: the OpenAI-compatible list of served models (one: ``served_model_name``).

OpenAI-compatible tools ask for it first (the openai client's ``models.list()``); vLLM adds
``root`` and ``max_model_len``, and so does this server, with the weights' ``policy_version``.
``GET /v1/models/{model}`` retrieves one (404 ``model_not_found`` for another name). The work
is ``ModelServing``'s (``gspo_rl.server.rollouts.serving.models``).
"""

from __future__ import annotations

from fastapi import APIRouter

from gspo_rl.server.api.deps import ModelsDep
from gspo_rl.server.api.error_docs import error_responses
from gspo_rl.server.rollouts.protocol.models import ModelCard, ModelList

router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelList, responses=error_responses(401))
async def list_models(models: ModelsDep) -> ModelList:
    """The model this server serves."""
    return models.served()


@router.get("/v1/models/{model}", response_model=ModelCard,
            responses=error_responses(401, 404, 422))
async def retrieve_model(model: str, models: ModelsDep) -> ModelCard:
    """One model by name: this server's, or 404."""
    return models.retrieve(model)
