"""Environments written for verifiers' 0.1.x API (``load_environment()`` returning a
``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``, ``vf.ToolEnv``) are refused at load, before
anything starts, with a message that says what runs (a ``verifiers.v1`` taskset), not an
error from deep inside verifiers' loader. The installed verifiers 0.4 ships none of the 0.1.x
classes (checked here), so the modules below are written as 0.1.x environments are, against
the real installed package, and the one that exports a class defines its own stand-in."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from gspo_rl.client.loading import load_environment

pytest.importorskip("verifiers.v1", reason="the verifiers extra is not installed")

VF_MATH = Path(__file__).parent / "verifiers_envs" / "gspo_vf_math"
ARGS = {"harness": "null", "group_size": 2}
SUPPORTED = ("verifiers.v1", "vf.Taskset subclass", "__all__", "docs/environments/verifiers.md")
LEGACY = "it is written for verifiers 0.1.x's API"

MODULES = {
    # the 0.1.x entry point, its classes reached only when it is called
    "vf_returns_old_env": (
        "import verifiers as vf\n\n"
        "def load_environment(**kwargs):\n"
        "    return vf.SingleTurnEnv(dataset=None, rubric=vf.Rubric(funcs=[]))\n",
        "defines load_environment() and exports no verifiers.v1 Taskset subclass"),
    "vf_imports_old_class": (
        "from verifiers import SingleTurnEnv\n\n"
        "def load_environment(**kwargs):\n    return SingleTurnEnv()\n",
        "uses verifiers.SingleTurnEnv, which the installed verifiers does not have"),
    "vf_imports_old_module": (
        "import verifiers as vf\nfrom verifiers.types import Messages\n\n"
        "def load_environment(**kwargs):\n    return vf.ToolEnv(tools=[])\n",
        "uses verifiers.types, which the installed verifiers does not have"),
    "vf_subclasses_old_class": (
        "import verifiers as vf\n\nclass Game(vf.MultiTurnEnv):\n    pass\n\n"
        "def load_environment(**kwargs):\n    return Game()\n",
        "uses verifiers.MultiTurnEnv, which the installed verifiers does not have"),
}


def write(tmp_path: Path, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(source)
    return f"verifiers:{tmp_path / name}.py"


def refusal(spec: str, args: dict | None = None) -> str:
    with pytest.raises(ValueError) as info:
        load_environment(spec, args=dict(ARGS, **(args or {})))
    return str(info.value)


def test_verifiers_0_4_ships_no_0_1_class() -> None:
    vf = importlib.import_module("verifiers")
    for name in ("SingleTurnEnv", "MultiTurnEnv", "ToolEnv", "Environment", "Rubric"):
        assert not hasattr(vf, name)
        assert not hasattr(importlib.import_module("verifiers.v1"), name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_0_1_environment_is_refused_saying_what_runs(tmp_path: Path, name: str) -> None:
    source, says = MODULES[name]
    spec = write(tmp_path, name, source)
    message = refusal(spec)
    assert message.startswith(f"{spec}: ") and says in message and LEGACY in message
    assert all(s in message for s in SUPPORTED), message
    for deep in ("defines no `__all__`", "not found (tried to import", "cannot import name"):
        assert deep not in message, "verifiers' loader error, not ours"


STAND_IN = '''
import verifiers.v1 as vf


class SingleTurnEnv:
    """A stand-in for verifiers 0.1.x's class: an environment object, not a verifiers.v1 one."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs


class OnlyAnEnv(vf.Env):
    pass


__all__ = [{exports}]


def load_environment(**kwargs):
    return SingleTurnEnv(**kwargs)
'''


@pytest.mark.parametrize(("exports", "says"), [
    ('"SingleTurnEnv"', "exports no verifiers.v1 Taskset subclass"),
    ('"OnlyAnEnv"', "exports no verifiers.v1 Taskset subclass"),
])
def test_what_is_not_a_v1_taskset_is_refused(tmp_path: Path, exports: str, says: str) -> None:
    spec = write(tmp_path, "stand_in", STAND_IN.format(exports=exports))
    message = refusal(spec)
    assert says in message and "load_environment()" in message and LEGACY in message
    assert all(s in message for s in SUPPORTED)


def test_a_module_with_no_v1_export_and_no_entry_point_says_what_it_exports(
        tmp_path: Path) -> None:
    bare = refusal(write(tmp_path, "bare", "X = 1\n"))
    assert "exports no verifiers.v1 Taskset subclass (no __all__)" in bare
    assert LEGACY not in bare and all(s in bare for s in SUPPORTED)
    listed = refusal(write(tmp_path, "listed", "X = 1\n__all__ = ['X']\n"))
    assert "(__all__ = ['X'])" in listed


def test_an_env_id_that_is_no_v1_env_is_refused(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``--env-arg id=MODULE`` names another ``Env`` for the taskset: a 0.1.x module there is
    refused as well, naming the Env it should export."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "old_game_env.py").write_text(STAND_IN.format(exports='"SingleTurnEnv"'))
    message = refusal(f"verifiers:{VF_MATH}", {"id": "old_game_env"})
    assert "environment module 'old_game_env' defines load_environment() and exports no " \
           "verifiers.v1 Env subclass" in message and LEGACY in message


def test_a_module_missing_a_dependency_says_which(tmp_path: Path) -> None:
    spec = write(tmp_path, "needs_dep", "import no_such_dependency_xyz\n")
    message = refusal(spec)
    assert "taskset" in message and "cannot be imported: No module named " \
           "'no_such_dependency_xyz'" in message


def test_gspo_up_refuses_it_before_anything_starts(tmp_path: Path) -> None:
    from gspo_rl.cli.tasks import TaskConfigError
    from gspo_rl.launch.workload import make_workload

    spec = write(tmp_path, "vf_returns_old_env", MODULES["vf_returns_old_env"][0])
    with pytest.raises(TaskConfigError, match="written for verifiers 0.1.x's API"):
        make_workload(None, [], None, None, None, tmp_path, envs=[spec],
                      env_args=["harness=null"])


def test_a_v1_taskset_passes_the_check() -> None:
    env = load_environment(f"verifiers:{VF_MATH}", args=ARGS)
    assert type(env).__name__ == "VerifiersEnvironment" and env.group_size == 2
