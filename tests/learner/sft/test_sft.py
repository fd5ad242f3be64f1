"""``gspo sft`` on the tiny model: a few demonstrations lower the negative log-likelihood of
their assistant tokens and not of the masked ones; the output is a checkpoint that the rollout
server serves (and answers as taught) and that the RL learner trains from; runs resume; bad
input is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
import redis
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from gspo_rl.cli import app
from gspo_rl.contract.schema import READY_STREAM_FIELD, Keys, pack_ready_group
from gspo_rl.learner.checkpoint.store import SaveDirError, list_checkpoints
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.loop import Learner
from gspo_rl.learner.model.policy import Policy
from gspo_rl.learner.sft.config import SFTConfig
from gspo_rl.learner.sft.data import Layout, read_demonstrations
from gspo_rl.learner.sft.train import run_sft, token_nll
from gspo_rl.learner.tracking.metrics import trained_history
from gspo_rl.learner.weights.base import NoSync
from tests.helpers.learner_data import sample_group
from tests.helpers.serving import API_KEY, MODEL_NAME, running_server

# Prompts in capitals and digits, answers in lower-case words: the two share no text.
ANSWERS = {"RED 1": "apple", "RED 2": "cherry", "BLUE 3": "ocean", "BLUE 4": "sky"}


def _write_demos(path: Path) -> Path:
    with path.open("w") as f:
        for q, a in ANSWERS.items():
            f.write(json.dumps({"messages": [{"role": "user", "content": q},
                                             {"role": "assistant", "content": a}]}) + "\n")
    return path


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """SFT of the tiny model on the demonstrations; (config, result, NLL before, after)."""
    tmp = tmp_path_factory.mktemp("sft")
    cfg = SFTConfig(model=str(tiny_model_dir), data=str(_write_demos(tmp / "demos.jsonl")),
                    save_dir=str(tmp / "out"), epochs=40, batch_size=4, lr=3e-3,
                    warmup_steps=2, save_every=25, report_to="tensorboard")
    tok_demos = read_demonstrations(Path(cfg.data), Layout(_tokenizer(tiny_model_dir)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on shared cores: 20x faster than 2 threads
    try:
        before = token_nll(Policy.load(tiny_model_dir, "cpu"), tok_demos, 4096, 0)
        result = run_sft(cfg)
        after = token_nll(Policy.load(result.checkpoint, "cpu"), tok_demos, 4096, 0)
    finally:
        torch.set_num_threads(threads)
    return cfg, result, before, after


def _tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_sft_lowers_the_nll_of_the_assistant_tokens_only(trained) -> None:
    cfg, result, before, after = trained
    assert result.steps == 40 and len(result.losses) == 40
    assert after["assistant"] < 0.1 * before["assistant"], (before, after)
    assert after["other"] > 0.8 * before["other"], (before, after)  # masked: not learned
    # one step record per step, and the checkpoints every save_every steps and at the end
    records = [json.loads(x) for x in Path(cfg.metrics_path).read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "sft"] == list(range(1, 41))
    assert [r["step"] for r in records if r["event"] == "checkpoint"] == [25, 40]
    ckpts = list_checkpoints(cfg.save_dir)
    assert [c.state.step for c in ckpts] == [25, 40] and ckpts[-1].state.kind == "sft"
    assert (Path(cfg.save_dir) / "tracking" / "tensorboard").is_dir()


def test_the_served_checkpoint_answers_as_taught(trained, redis_url) -> None:
    _, result, _, _ = trained
    with running_server(result.checkpoint, redis_url) as s:
        client = openai.OpenAI(base_url=s.v1, api_key=API_KEY, max_retries=0, timeout=60)
        for q, a in ANSWERS.items():
            out = client.chat.completions.create(
                model=MODEL_NAME, messages=[{"role": "user", "content": q}], max_tokens=8,
                temperature=0.1, seed=0)
            assert out.choices[0].message.content == a


def test_the_rl_learner_trains_from_the_checkpoint(trained, redis_url, tmp_path) -> None:
    _, result, _, _ = trained
    client = redis.Redis.from_url(redis_url)
    sampler = AutoModelForCausalLM.from_pretrained(str(result.checkpoint), dtype=torch.float32)
    g = sample_group(sampler, group_size=2, prompt_len=3, new_tokens=(2, 4), seed=1)
    client.xadd(Keys().ready_stream, {READY_STREAM_FIELD: pack_ready_group(g)})
    cfg = LearnerConfig(model=str(result.checkpoint), redis_url=redis_url,
                        save_dir=str(tmp_path / "rl"), groups_per_step=1, max_steps=1,
                        read_timeout_s=0.5, console=False, weight_sync="none")
    state = Learner(cfg, client=client, sync=NoSync(client, Keys())).run()
    assert (state.step, state.version) == (1, 1)
    assert [h["group_ids"] for h in trained_history(tmp_path / "rl" / "metrics.jsonl")] == [
        [g.group_id]]
    # --resume into the SFT directory is refused, pointing at --model
    sft_dir = str(Path(result.checkpoint).parent)
    with pytest.raises(SaveDirError, match="--model"):
        Learner(cfg.model_copy(update={"save_dir": sft_dir, "resume": True}), client=client,
                sync=NoSync(client, Keys()))


def test_a_stopped_run_resumes_where_it_stopped(tiny_model_dir, tmp_path) -> None:
    cfg = SFTConfig(model=str(tiny_model_dir), data=str(_write_demos(tmp_path / "d.jsonl")),
                    save_dir=str(tmp_path / "out"), epochs=2, batch_size=3, max_steps=2,
                    lr=1e-3)
    assert run_sft(cfg).steps == 2
    with pytest.raises(SaveDirError, match="--resume"):
        run_sft(cfg)
    resumed = run_sft(cfg.model_copy(update={"resume": True, "max_steps": None}))
    assert resumed.steps == 4 and len(resumed.losses) == 2  # 2 epochs of 2 steps
    steps = [json.loads(x) for x in Path(cfg.metrics_path).read_text().splitlines()]
    assert [r["step"] for r in steps if r["event"] == "sft"] == [1, 2, 3, 4]


def test_the_cli_refuses_bad_input_in_one_line(tiny_model_dir, tmp_path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    out = CliRunner().invoke(app, ["sft", "--model", str(tiny_model_dir), "--data", str(data),
                                   "--save-dir", str(tmp_path / "o")])
    assert out.exit_code == 2 and "d.jsonl:1: no assistant message" in out.output
    out = CliRunner().invoke(app, ["sft", "--model", str(tiny_model_dir), "--data", str(data),
                                   "--save-dir", str(tmp_path / "o"), "--lr", "-1"])
    assert out.exit_code == 2 and "lr" in out.output and "Traceback" not in out.output
