"""What each agent seat of a verifiers environment would run, checked before anything starts.

``check_seats(env, config)`` raises ``ValueError`` (the adapter's refusal at start) for a seat
that would:

- play a harness other than ``null`` (verifiers' default, ``bash``, or a coding agent: a shell
  tool, code execution) in the runtime the adapter chose for it, the local subprocess one:
  the model's commands would run on this machine. Setting the seat's runtime (``docker``,
  ``podman``, ..., or ``subprocess`` to run it here knowingly) or ``harness=null`` lifts it.
- speak another API than chat completions (``claude_code`` and ``codex`` speak Anthropic's and
  the Responses API; ``pi`` and ``kimi_code`` unless ``transport`` is ``chat_completions``): the
  rollout server serves chat completions only.
"""

from __future__ import annotations

from typing import Any

OTHER_API = {"claude_code": "Anthropic's Messages API", "codex": "OpenAI's Responses API"}
TRANSPORT_HARNESSES = frozenset({"pi", "kimi_code"})


def harness_of(env: Any, seat_config: Any) -> Any:
    """The harness config a seat plays: its own, else the taskset's default (verifiers'
    ``Env._agent_harness``)."""
    own = getattr(seat_config, "harness", None)
    return own if own is not None else getattr(env, "_default_harness", None)


def seat_problem(seat: str, harness: Any, runtime_set: bool) -> str | None:
    """Why ``seat`` cannot run as configured (None: it can)."""
    hid = str(getattr(harness, "id", None) or "bash")
    if hid in OTHER_API:
        return (f"agent seat {seat!r} plays the {hid!r} harness, which speaks "
                f"{OTHER_API[hid]}; the rollout server serves chat completions only: set "
                "harness=null (a plain chat loop) or a chat-completions harness")
    transport = getattr(harness, "transport", "chat_completions")
    if hid in TRANSPORT_HARNESSES and transport != "chat_completions":
        return (f"agent seat {seat!r} plays the {hid!r} harness over {transport!r}; the "
                f"rollout server serves chat completions only: set "
                f"{seat}.harness.transport=chat_completions")
    if hid != "null" and not runtime_set:
        return (f"agent seat {seat!r} plays the {hid!r} harness, which runs the model's "
                "commands (a shell, code) in its runtime, and no runtime is set: the adapter's "
                "default is this machine (the local subprocess runtime). Set "
                f"{seat}.runtime.type=docker (or podman, prime, ...) to isolate it, "
                f"{seat}.runtime.type=subprocess to run it on this machine knowingly, or "
                "harness=null for a plain chat loop")
    return None


def check_seats(env: Any, config: Any, seats: list[str], user_config: dict[str, Any],
                taskset_id: str) -> None:
    """Refuses (``ValueError``) an environment a seat of which cannot run (module docstring).
    ``user_config``: the settings as given (which seats set their runtime)."""
    problems = []
    for seat in seats:
        runtime_set = "runtime" in (user_config.get(seat) or {})
        problem = seat_problem(seat, harness_of(env, getattr(config, seat)), runtime_set)
        if problem:
            problems.append(problem)
    if problems:
        raise ValueError(f"verifiers:{taskset_id}: " + "; ".join(problems))
