"""gspo/launch/runlog.py: the run records that `gspo up` and the benchmarks read and summarise."""

from __future__ import annotations

import json
import math

import pytest

from gspo_rl.launch.runlog import (
    ENV_WINDOW,
    JsonlTail,
    moving,
    plot_rewards,
    read_metrics,
    step_records,
    summarize,
    version_curve,
)


def _step(step: int, time: float, reward: float, **extra: object) -> dict[str, object]:
    return {"event": "step", "step": step, "time": time, "reward_mean": reward, **extra}


def test_moving_average_uses_shorter_windows_at_the_start():
    assert moving([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert moving([], 3) == []
    assert moving([2.0], 5) == [2.0]


def test_step_records_leave_out_start_and_stop_events():
    records = [{"event": "start"}, _step(1, 0.0, 0.5), {"step": 2}, {"event": "stop"}]
    assert step_records(records) == [records[1], records[2]]


def test_summarize_learner_steps():
    steps = [
        {"event": "start", "time": 0.0},
        _step(1, 10.0, 0.2, tokens=100, staleness={"0": 3, "1": 1}, clip_fraction=0.1,
              dropped={"dropped_stale": 0}),
        _step(2, 12.0, 0.6, tokens=300, staleness={"1": 2}, clip_fraction=0.3,
              dropped={"dropped_stale": 1}),
        _step(3, 14.0, 1.0, tokens=500, staleness={"2": 2}, clip_fraction=0.2,
              dropped={"dropped_stale": 4}),
    ]
    out = summarize(steps, threshold=0.6, window=2)
    assert out["steps"] == 3.0
    assert out["tokens_per_s"] == pytest.approx((300 + 500) / 4.0)  # first step's tokens excluded
    # moving averages over 2 steps: 0.2, 0.4, 0.8 -> first >= 0.6 at step 3, 4 s after step 1
    assert out["time_to_threshold_s"] == pytest.approx(4.0)
    assert out["final_reward"] == pytest.approx(0.8)
    assert out["staleness_mean"] == pytest.approx((0 * 3 + 1 * 1 + 1 * 2 + 2 * 2) / 8)
    assert out["clip_fraction_mean"] == pytest.approx(0.2)
    assert out["dropped_stale"] == 4.0


def test_summarize_threshold_never_reached_is_nan():
    out = summarize([_step(1, 0.0, 0.1), _step(2, 1.0, 0.2)], threshold=0.9)
    assert math.isnan(out["time_to_threshold_s"])
    assert out["final_reward"] == pytest.approx(0.15)


def test_summarize_with_environment_records():
    env = [{"time": 100.0 + i, "reward": 0.0 if i < ENV_WINDOW else 1.0, "version": i // 8}
           for i in range(2 * ENV_WINDOW)]
    out = summarize([_step(1, 0.0, 0.5), _step(2, 1.0, 0.5)], threshold=0.75,
                    env_records=env)
    assert out["sampled_final_reward"] == pytest.approx(1.0)
    # the ENV_WINDOW-group average passes 0.75 once 3/4 of the window holds ones
    first = ENV_WINDOW + math.ceil(0.75 * ENV_WINDOW) - 1
    assert out["sampled_time_to_threshold_s"] == pytest.approx(float(first))


def test_summarize_with_too_few_steps_still_reports_the_environment():
    env = [{"time": float(i), "reward": 1.0, "version": 0} for i in range(ENV_WINDOW)]
    out = summarize([_step(1, 0.0, 0.5)], env_records=env)
    assert out == {"steps": 1.0, "sampled_final_reward": 1.0,
                   "sampled_time_to_threshold_s": float(ENV_WINDOW - 1)}
    assert summarize([]) == {"steps": 0.0}


def test_version_curve_groups_by_sampling_version():
    env = [{"reward": 1.0, "version": 1}, {"reward": 0.0, "version": 0},
           {"reward": 0.5, "version": 1}, {"reward": 1.0, "version": -1}]
    assert version_curve(env) == [(0, 0.0, 1), (1, 0.75, 2)]


def test_jsonl_tail_reads_only_new_complete_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    assert tail.new_records() == []  # no file yet
    path.write_text(json.dumps({"a": 1}) + "\n" + '{"b": ')
    assert tail.new_records() == [{"a": 1}]
    with path.open("a") as f:
        f.write('2}\nnot json\n{"c": 3}\n')
    assert tail.new_records() == [{"b": 2}, {"c": 3}]
    assert tail.new_records() == []
    assert read_metrics(path) == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert read_metrics(tmp_path / "missing.jsonl") == []


def test_plot_rewards_writes_a_png(tmp_path):
    records = [_step(i, float(i), i / 10) for i in range(1, 11)]
    sampled = [(v, v / 10, 4) for v in range(10)]
    path = plot_rewards(records, sampled, tmp_path / "curve.png", "test")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_rewards([], [], tmp_path / "none.png", "empty") is None


def test_the_plot_legend_names_every_line(tmp_path, monkeypatch):
    """The light raw line (each version's mean) is in the legend beside the two curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "close", lambda *a, **k: None)  # keep the figure to read it
    records = [_step(i, float(i), i / 10) for i in range(1, 11)]
    plot_rewards(records, [(v, v / 10, 4) for v in range(10)], tmp_path / "c.png", "t")
    ax = plt.gcf().axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(ax.get_lines()) == len(labels) == 3, labels
    assert any("mean of each version" in label for label in labels), labels
    plt.close("all")


def test_the_summary_says_why_steps_follow_a_reached_target(tmp_path):
    """"reached at step 25" beside "27 learner steps" read as a contradiction: the summary
    says the groups in flight at the target were trained too, and a run without a target
    never says "NOT reached"."""
    from gspo_rl.launch.up import UpResult

    def result(reached: bool | None) -> list[str]:
        return UpResult(steps=27, rewards=[0.8] * 27, sampled=[(0, 0.1, 8), (26, 0.9, 8)],
                        seconds=60.0, metrics_path=tmp_path / "m.jsonl", plot_path=None,
                        target_reached=reached).summary(0.8)

    reached = "\n".join(result(True))
    assert "target reward 0.8 (0: none): reached" in reached
    assert "the groups in flight then were trained too (all 27 learner steps above)" in reached
    assert "NOT reached in 27 learner steps" in "\n".join(result(False))
    assert "target" not in "\n".join(result(None))
