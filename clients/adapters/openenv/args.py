"""The ``--env-arg`` settings of an ``openenv:`` environment (``OpenEnvArgs``).

``parse_args(args)`` validates the settings dict that ``load`` receives: unknown keys and bad
values are refused with one ``ValueError`` that names every problem (``openenv: bad
--env-arg (...)``), before anything contacts the server.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gspo_rl.client.adapters.chat import check_seed, validated


class OpenEnvArgs(BaseModel):
    """The ``--env-arg`` settings of an ``openenv:`` environment."""

    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(4, ge=1)
    """Episodes per group, each in its own session of the server."""
    max_turns: int = Field(8, ge=1)
    """Chat completions per episode at most; an episode not done by then ends there."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Over ``SAMPLING``; keys the openai client lacks (top_k, min_p) go in ``extra_body``."""
    system_prompt: str | None = None
    """The first message; default: none for text actions, the action schema for JSON ones."""
    action_format: Literal["auto", "text", "json"] = "auto"
    """text: the reply is ``action_field``'s value; json: a JSON object of the action; auto:
    text when the action has one string field and requires no other, else json."""
    action_field: str | None = None
    """The action field the reply fills (text actions); default: its only string field."""
    observation_field: str | None = None
    """The observation field shown to the model; default: ``OBSERVATION_FIELDS``' first, else
    the whole observation as JSON."""
    reward: Literal["sum", "last"] = "sum"
    """The episode's reward: the sum of its turn rewards, or the last one."""
    seed: bool | int = True
    """true: each group's seed (drawn from the run's seed) goes to every reset of the group;
    false: no seed is sent (the server picks, episodes of a group may differ); an int: every
    group resets with this seed."""
    invalid_penalty: float = Field(0.1, ge=0.0)
    """An invalid action's turn reward is ``-invalid_penalty``."""
    max_sessions: int | None = Field(None, ge=1)
    """Sessions held at once by this environment at most (episodes beyond wait); default: no
    limit here, the server's applies (an episode waits ``session_wait_s`` for a free one)."""
    session_wait_s: float = Field(60.0, gt=0.0)
    """How long an episode waits for a session while the server is at capacity."""
    timeout_s: float = Field(120.0, gt=0.0)
    """Time limit of one chat completion, of one reply of the environment server."""

    seed_rule = field_validator("seed")(check_seed)


def parse_args(args: dict[str, Any]) -> OpenEnvArgs:
    """The validated settings; ValueError naming every bad key."""
    return validated(OpenEnvArgs, args, "openenv")
