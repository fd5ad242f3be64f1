"""A single-turn math taskset: "What is a + b?", rewarded 1 for the right number in the reply
(and, so that a random tiny model sees signal, 0.5 for an even-length reply)."""

import verifiers.v1 as vf


class MathConfig(vf.TasksetConfig):
    n: int = 30


class MathData(vf.TaskData):
    answer: str


class MathTask(vf.Task[MathData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        reply = trace.last_reply
        if task.answer in reply.split():
            return 1.0
        return 0.5 if len(reply) % 2 == 0 else 0.0


class MathTaskset(vf.Taskset[MathTask, MathConfig]):
    def load(self):
        for i in range(self.config.n):
            a, b = i % 7, i // 7
            yield MathTask(MathData(id=f"add-{i}", prompt=f"What is {a} + {b}?",
                                    answer=str(a + b)), self.config.task)


__all__ = ["MathTaskset"]
