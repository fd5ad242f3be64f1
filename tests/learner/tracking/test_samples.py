"""Tables of sampled episodes (gspo_rl.learner.tracking.samples): one row per group, the model's
turns apart from the environment's, capped text, the Markdown TensorBoard shows, the real
tokenizer of the tiny model, and a logger that never stops training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gspo_rl.contract.schema import ReadyGroup, RolloutRecord
from gspo_rl.learner.tracking.samples import (
    COLUMNS,
    MAX_CHARS,
    SampleLogger,
    cap,
    completion_text,
    markdown_table,
    sample_rows,
)
from gspo_rl.redisq.ready.reader import Batch


def fake_decode(ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in ids)


def rollout(ids: list[int], prompt_len: int, turns: list[tuple[int, int]],
            versions: list[int], gid: str = "g") -> RolloutRecord:
    mask = np.zeros(len(ids), dtype=np.uint8)
    for s, e in turns:
        mask[s:e] = 1
    v = np.full(len(ids), -1, dtype=np.int32)
    v[mask.astype(bool)] = versions
    return RolloutRecord(rollout_id=f"{gid}-r", group_id=gid, token_ids=np.array(ids, np.int32),
                         loss_mask=mask, logprobs=np.zeros(len(ids), np.float32), versions=v,
                         prompt_len=prompt_len, turns=turns)


def group(gid: str, r: RolloutRecord, meta: dict[str, Any] | None = None) -> ReadyGroup:
    return ReadyGroup(group_id=gid, rollouts=[r, r], rewards=[1.0, 0.0], advantages=[0.7, -0.7],
                      turn_rewards=[None, None], metadata=meta or {})


def test_a_single_turn_row() -> None:
    g = group("g1", rollout([1, 2, 3, 4, 5], 2, [(2, 5)], [3, 3, 4]), {"task_id": "q17"})
    (row,) = sample_rows([g], [1], fake_decode, step=10)
    assert tuple(row) == COLUMNS
    assert row == {"step": 10, "group": "g1", "task": "q17", "prompt": "t1 t2",
                   "completion": "t3 t4 t5", "reward": 1.0, "advantage": 0.7,
                   "versions": "3-4", "staleness": 1, "turns": 1}


def test_a_multi_turn_completion_marks_the_model_and_the_environment() -> None:
    # prompt [1, 2]; model [3, 4]; tool [5, 6]; model [7]; template tail [8]
    r = rollout([1, 2, 3, 4, 5, 6, 7, 8], 2, [(2, 4), (6, 7)], [5, 5, 6])
    assert completion_text(r, fake_decode) == \
        "[model] t3 t4\n[env] t5 t6\n[model] t7\n[env] t8"
    (row,) = sample_rows([group("g", r)], [0], fake_decode, step=1)
    assert row["turns"] == 2 and row["versions"] == "5-6" and row["task"] == ""


def test_one_row_per_group_at_most_max_rows() -> None:
    groups = [group(f"g{i}", rollout([1, 2, 3], 1, [(1, 3)], [0, 0])) for i in range(12)]
    rows = sample_rows(groups, [0] * 12, fake_decode, step=1)
    assert [r["group"] for r in rows] == [f"g{i}" for i in range(8)]
    assert sample_rows(groups, [0] * 12, fake_decode, step=1, max_rows=3)[-1]["group"] == "g2"


def test_text_is_capped_prompts_keep_their_end() -> None:
    text = "a" * 10 + "b" * 10
    assert cap(text, 10, "tail") == "… " + "b" * 10
    assert cap(text, 10, "head") == "a" * 10 + " …"
    assert cap(text, 10) == "aaaaa … bbbbb"
    assert cap("short", 10) == "short"
    long_ids = list(range(3000))
    (row,) = sample_rows([group("g", rollout(long_ids, 1500, [(1500, 3000)], [0] * 1500))],
                         [0], fake_decode, step=1)
    assert len(row["prompt"]) <= MAX_CHARS + 2 and row["prompt"].endswith("t1499")
    assert row["completion"].startswith("t1500 ") and row["completion"].endswith("t2999")


def test_markdown_escapes_pipes_markup_and_line_breaks() -> None:
    rows = [{"step": 1, "prompt": "a|b <|im_start|>", "completion": "x\ny", "reward": 0.123456}]
    table = markdown_table(rows)
    assert table.splitlines()[:2] == ["| step | prompt | completion | reward |",
                                      "|---|---|---|---|"]
    assert table.splitlines()[2] == \
        "| 1 | a\\|b &lt;\\|im_start\\|&gt; | x<br>y | 0.1235 |"
    assert markdown_table([]) == ""


class _Tracker:
    def __init__(self) -> None:
        self.tables: list[tuple[int, list[dict[str, Any]]]] = []

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.tables.append((step, rows))


def test_the_logger_decodes_with_the_models_tokenizer_every_n_steps(tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    prompt, answer = tok("Say cat:")["input_ids"], tok(" cat")["input_ids"]
    ids = prompt + answer
    g = group("g", rollout(ids, len(prompt), [(len(prompt), len(ids))], [2] * len(answer)))
    batch = Batch(groups=[g], entry_ids=["1-0"], dropped_stale=0, staleness=[1])
    tracker = _Tracker()
    samples = SampleLogger(every=2, tokenizer_src=tiny_model_dir)
    for step in (1, 2, 3, 4):
        samples.log(tracker, step, batch)  # type: ignore[arg-type]
    samples.log(None, 6, batch)  # no tracker: nothing is decoded
    assert [s for s, _ in tracker.tables] == [2, 4]
    row = tracker.tables[0][1][0]
    assert row["prompt"] == "Say cat:" and row["completion"] == " cat"
    SampleLogger(every=0, tokenizer_src=tiny_model_dir).log(tracker, 10, batch)  # type: ignore
    assert len(tracker.tables) == 2


def test_a_failure_is_logged_once_and_training_goes_on(tmp_path: Path, caplog) -> None:
    bad = group("g", rollout([1, 2, 3], 1, [(1, 3)], [0, 0]))
    bad.rollouts[0].turns = [("x", "y")]  # type: ignore[list-item]  (a corrupt record)
    batch = Batch(groups=[bad], entry_ids=["1-0"], dropped_stale=0, staleness=[0])
    samples = SampleLogger(every=1, tokenizer_src=tmp_path / "no-model")
    tracker = _Tracker()
    for step in (1, 2):
        samples.log(tracker, step, batch)  # type: ignore[arg-type]
    assert tracker.tables == []
    assert sum("not tabulated" in r.message for r in caplog.records) == 1
    assert sum("no tokenizer" in r.message for r in caplog.records) == 1  # ids as text
    assert samples.decoder()([5, 6]) == "5 6"
