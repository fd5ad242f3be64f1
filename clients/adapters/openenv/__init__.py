"""OpenEnv environment servers (``openenv-core``) as multi-turn environments: ``openenv:URL``.

``load(target, args)``: ``target`` is the server's base URL (``http://127.0.0.1:8001``; https,
ws and wss too). Sessions go through openenv-core's own ``GenericEnvClient`` (its WebSocket
``/ws``: one connection is one session with its own environment instance on the server).
No environment package is imported here: a typed-client spec (``module:ClientClass@URL``)
is refused, since a typed client only converts the JSON that ``/schema`` describes. ``load``
reads ``/schema``, settles how text becomes an action and which observation text the model
reads, and opens ``group_size`` sessions at once
(a reset each): a server that cannot be reached, whose schema does not fit, or that holds fewer
sessions (``max_concurrent_envs``) is refused with a ``ValueError``.

An episode resets its own session (the group's seed, so that the G episodes of a group play
one task; ``episode_id``: the rollout id), shows the observation as the user message, asks the
rollout server for the next assistant message (``session.extra_body`` on every call, the whole
conversation each time), turns the text into an action (one field's value, or a JSON object),
steps, and repeats until ``done`` or ``max_turns``. ``turn_rewards``: one per chat completion,
the step's reward (None counts 0.0); an invalid action (no JSON object, or refused by the
server's action model) steps nothing, earns ``-invalid_penalty`` and gets the error as the next
user message. The reward: the sum of ``turn_rewards`` (``reward="sum"``) or the last one. Any
other error of the server fails the episode. Guide: docs/environments/openenv.md.

Modules: ``args`` (``OpenEnvArgs``, the ``--env-arg`` settings), ``codec`` (text <-> actions
and observations), ``client`` (the server: URL, ``/schema``, WebSocket sessions) and
``environment`` (``OpenEnvEnvironment`` and ``load``); each imports only those before it.
"""

from __future__ import annotations

from gspo_rl.client.adapters.chat import OPENAI_KEYS, assistant_message
from gspo_rl.client.adapters.openenv.args import OpenEnvArgs, parse_args
from gspo_rl.client.adapters.openenv.client import (
    CAPACITY,
    CLOSE_WAIT_S,
    INVALID,
    SCHEMES,
    EnvServerError,
    client_class,
    fetch_schema,
    server_url,
)
from gspo_rl.client.adapters.openenv.codec import (
    ACTION_BASE,
    OBSERVATION_BASE,
    OBSERVATION_FIELDS,
    ActionCodec,
    InvalidAction,
    is_string,
    parse_json_action,
    render,
    resolve_action,
    resolve_observation,
    schema_fields,
)
from gspo_rl.client.adapters.openenv.environment import (
    PROBE_WAIT_S,
    SAMPLING,
    SEEDS,
    OpenEnvEnvironment,
    OpenEnvSession,
    Turn,
    check_sessions,
    load,
    reset_kwargs,
    run_blocking,
)

__all__ = [
    "ACTION_BASE", "CAPACITY", "CLOSE_WAIT_S", "INVALID", "OBSERVATION_BASE",
    "OBSERVATION_FIELDS", "OPENAI_KEYS", "PROBE_WAIT_S", "SAMPLING", "SCHEMES", "SEEDS",
    "ActionCodec", "EnvServerError", "InvalidAction", "OpenEnvArgs", "OpenEnvEnvironment",
    "OpenEnvSession", "Turn", "assistant_message", "check_sessions", "client_class",
    "fetch_schema", "is_string", "load", "parse_args", "parse_json_action", "render",
    "reset_kwargs", "resolve_action", "resolve_observation", "run_blocking", "schema_fields",
    "server_url",
]
