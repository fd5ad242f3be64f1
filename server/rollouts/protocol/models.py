"""``GET /v1/models``: the OpenAI model list and card, with vLLM's ``root`` and
``max_model_len`` and this server's ``policy_version``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


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
