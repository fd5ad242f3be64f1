"""``GET /v1/models`` below HTTP: the one model this server serves, as an OpenAI model card
(with vLLM's ``root`` and ``max_model_len`` and the weights' ``policy_version``); another
name is not found (404 ``model_not_found``)."""

from __future__ import annotations

from dataclasses import dataclass

from gspo_rl.server.config import ServerSettings
from gspo_rl.server.engines.sampler import SamplingEngine
from gspo_rl.server.rollouts.errors import not_found
from gspo_rl.server.rollouts.protocol.models import ModelCard, ModelList


@dataclass(frozen=True)
class ModelServing:
    """One per app (``app.state.serving_models``); ``created``: when the server started."""

    settings: ServerSettings
    engine: SamplingEngine
    created: int

    def served(self) -> ModelList:
        """Every model this server serves (one)."""
        return ModelList(data=[self.card()])

    def retrieve(self, model: str) -> ModelCard:
        if model != self.settings.model_name:
            raise not_found(f"model {model!r} not found: this server serves "
                            f"{self.settings.model_name!r}", code="model_not_found")
        return self.card()

    def card(self) -> ModelCard:
        return ModelCard(id=self.settings.model_name, created=self.created,
                         root=self.engine.model_path, max_model_len=self.engine.max_model_len,
                         policy_version=self.engine.policy_version)
