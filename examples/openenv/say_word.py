"""An OpenEnv environment server to try the ``openenv:`` adapter with: "say the word".

    .venv/bin/python examples/openenv/say_word.py --port 8001      # the environment server
    .venv/bin/gspo up --env openenv:http://127.0.0.1:8001          # train against it

Each episode (a session on the server's WebSocket) picks a word from the reset's seed, asks the
model to say it, and steps ``STEPS`` times: each reply earns 0.25 per distinct letter of the
word it contains (at most 1.0), so a random tiny model starts with a signal. Built with
openenv-core's own server classes (``Environment``, ``create_fastapi_app``), as any OpenEnv
environment is; ``SUPPORTS_CONCURRENT_SESSIONS`` lets the G episodes of a group play at once.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app
from pydantic import Field

WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano")
STEPS = 3


class SayAction(Action):
    text: str = Field(description="what the player says")


class SayObservation(Observation):
    prompt: str = ""


class SayWord(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state, self.word = State(), ""

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> SayObservation:
        self.word = random.Random(seed).choice(WORDS)
        self._state = State(episode_id=episode_id, step_count=0)
        return SayObservation(prompt=f"Say the word {self.word}.")

    def step(self, action: SayAction, timeout_s: float | None = None,  # type: ignore[override]
             **kwargs: Any) -> SayObservation:
        self._state.step_count += 1
        reward = 0.25 * min(4, sum(c in action.text.lower() for c in set(self.word)))
        return SayObservation(prompt=f"Again: say {self.word}.", reward=reward,
                              done=self._state.step_count >= STEPS)

    @property
    def state(self) -> State:
        return self._state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--sessions", type=int, default=64, help="concurrent sessions it holds")
    args = p.parse_args()
    import uvicorn

    app = create_fastapi_app(SayWord, SayAction, SayObservation,
                             max_concurrent_envs=args.sessions)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
