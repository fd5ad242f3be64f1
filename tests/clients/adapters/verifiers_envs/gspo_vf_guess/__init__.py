"""A multi-turn game: the model guesses a letter; the environment answers "higher" or "lower"
as the next user turn, for ``turns`` turns; the reward is the share of replies that start with
a letter not past the secret (any text scores, so a random model sees signal)."""

import verifiers.v1 as vf


class GuessConfig(vf.TasksetConfig):
    turns: int = 3


class GuessData(vf.TaskData):
    secret: str
    turns: int


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    pass


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    INFINITE = True

    def load(self):
        i = 0
        while True:
            secret = "abcdefghijklmnopqrstuvwxyz"[i % 26]
            yield GuessTask(GuessData(id=f"guess-{i}", secret=secret, turns=self.config.turns,
                                      prompt="Guess my letter."), self.config.task)
            i += 1


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        secret, hits, played = task.data.secret, 0, 0
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while True:
                reply = segment.last_reply.strip().lower()
                played += 1
                hits += int(bool(reply) and reply[0] <= secret)
                if played >= task.data.turns or segment.terminated:
                    break
                hint = "Higher." if not reply or reply[0] < secret else "Lower."
                segment = await interaction.turn(hint)
        interaction.trace.record_reward("hits", hits / played)


__all__ = ["GuessEnv", "GuessTaskset"]
