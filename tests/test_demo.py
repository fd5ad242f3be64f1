"""The demo trains: `gspo up`'s whole stack lifts the alphabet task from chance to >= 0.8."""

from __future__ import annotations

import pytest

from gspo.up import UpConfig, read_metrics, run_up


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gspo_up_learns_the_demo_task(tmp_path):
    cfg = UpConfig(run_dir=tmp_path / "run", max_steps=120, minutes=10.0, target_reward=0.8)
    result = run_up(cfg)
    rewards = result.rewards
    assert len(rewards) >= 10, f"only {len(rewards)} learner steps"
    early = sum(rewards[:5]) / 5
    late = sum(rewards[-5:]) / 5
    assert early < 0.65, f"started above chance: {early:.2f}"  # a random model: ~0.5
    assert late >= 0.8, f"reward rose only to {late:.2f} in {result.seconds:.0f} s"
    assert result.plot_path is not None and result.plot_path.stat().st_size > 10_000
    records = [r for r in read_metrics(result.metrics_path) if r.get("event") == "step"]
    assert all("staleness" in r and "clip_fraction" in r for r in records)
    # every process was stopped: the run directory's logs are closed and complete
    assert (tmp_path / "run" / "server.log").exists()
