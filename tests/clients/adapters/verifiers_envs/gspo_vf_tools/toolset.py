"""The ``lookup`` tool of the tool environment, served over MCP by verifiers (run as a module:
``python -m gspo_vf_tools.toolset``)."""

import verifiers.v1 as vf

TABLE = {"alpha": "17", "beta": "42", "gamma": "8", "delta": "99"}


class LookupConfig(vf.SharedToolsetConfig):
    pass


class LookupToolset(vf.Toolset[LookupConfig, vf.State]):
    @vf.tool
    async def lookup(self, key: str) -> str:
        """The value stored under ``key`` ("unknown" if none)."""
        return TABLE.get(key, "unknown")


if __name__ == "__main__":
    LookupToolset.run()
