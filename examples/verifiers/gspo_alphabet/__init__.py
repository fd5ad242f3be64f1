"""The alphabet demo as a verifiers 0.4 taskset (``verifiers.v1``): "Say a word from a to m",
rewarded 1 when the reply's first letter lies in the half the prompt names. A tiny random
model starts at chance (~0.5) and has to read the prompt to pass 0.8.

    gspo up --env verifiers:examples/verifiers/gspo_alphabet --env-arg harness=null
"""

import verifiers.v1 as vf

HALVES = {"a to m": "abcdefghijklm", "n to z": "nopqrstuvwxyz"}


class AlphabetConfig(vf.TasksetConfig):
    tasks: int = 64
    """Tasks per pass (each names one half; the order alternates)."""


class AlphabetData(vf.TaskData):
    letters: str


class AlphabetTask(vf.Task[AlphabetData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def first_letter_in_half(self, task, trace) -> float:
        letter = next((c for c in trace.last_reply.lower() if "a" <= c <= "z"), None)
        return 1.0 if letter is not None and letter in task.letters else 0.0


class AlphabetTaskset(vf.Taskset[AlphabetTask, AlphabetConfig]):
    def load(self):
        halves = sorted(HALVES)
        for i in range(self.config.tasks):
            half = halves[i % 2]
            yield AlphabetTask(AlphabetData(id=f"{half}-{i}", prompt=f"Say a word from {half}:",
                                            letters=HALVES[half]), self.config.task)


__all__ = ["AlphabetTaskset"]
