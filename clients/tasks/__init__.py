"""Tasks from data: prompts and reference answers from JSONL, Parquet or a Hugging Face
``datasets`` directory, judged by a verifier (``gspo_rl.client.verifiers``).

    from gspo_rl.client.tasks import TaskConfig, build_environment
    env = build_environment(TaskConfig.load("tasks.toml"))   # gspo env tasks.toml

Reference: docs/tasks.md; tutorial: docs/tutorials/math.md.
"""

from gspo_rl.client.environment import TasksExhausted
from gspo_rl.client.tasks.config import (
    EvalConfig,
    MultiTurnConfig,
    SamplingConfig,
    SourceConfig,
    TaskConfig,
    VerifierConfig,
)
from gspo_rl.client.tasks.environment import (
    DataEnvironment,
    RetryEnvironment,
    SourceStats,
    build_environment,
    eval_environment,
)
from gspo_rl.client.tasks.records import read_records
from gspo_rl.client.tasks.sampler import TaskMixture, TaskSource
from gspo_rl.client.tasks.task import Fields, Task, make_task, make_tasks

__all__ = ["DataEnvironment", "EvalConfig", "Fields", "MultiTurnConfig", "RetryEnvironment",
           "SamplingConfig", "SourceConfig", "SourceStats", "Task", "TaskConfig",
           "TaskMixture", "TaskSource", "TasksExhausted", "VerifierConfig",
           "build_environment", "eval_environment", "make_task", "make_tasks", "read_records"]
