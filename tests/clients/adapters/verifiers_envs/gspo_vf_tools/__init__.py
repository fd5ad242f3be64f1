"""A tool environment: the model may call ``lookup(key)`` (an MCP tool server the taskset shares
between its episodes) to find a key's value; rewarded 1 for the value in the reply, else 0.5 for
an even-length reply (so a random tiny model sees signal)."""

import verifiers.v1 as vf

from gspo_vf_tools.toolset import TABLE, LookupConfig, LookupToolset


class ToolsConfig(vf.TasksetConfig):
    tools: LookupConfig = LookupConfig()


class KeyData(vf.TaskData):
    key: str


class KeyTask(vf.Task[KeyData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def found(self, task, trace) -> float:
        reply = trace.last_reply
        if TABLE[task.key] in reply:
            return 1.0
        return 0.5 if len(reply) % 2 == 0 else 0.0


class ToolsTaskset(vf.Taskset[KeyTask, ToolsConfig]):
    def load(self):
        for key in sorted(TABLE):
            yield KeyTask(KeyData(id=key, key=key, prompt=f"What is the value of {key}? "
                                  "Use the lookup tool."), self.config.task)

    @classmethod
    def toolsets(cls, config: ToolsConfig) -> list[vf.Toolset]:
        return [LookupToolset(config.tools)]


__all__ = ["ToolsTaskset"]
