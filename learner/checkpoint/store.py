"""Durable, atomic learner checkpoints in Hugging Face format.

Layout of ``save_dir``::

    step-00000012/              one complete checkpoint; loadable by from_pretrained as is
      config.json, model.safetensors, generation_config.json, tokenizer files (copied)
      trainer_state.pt          optimiser + LR schedule state, RNG states (torch.save of
                                tensors and plain containers: loads with weights_only=True)
      learner_state.json        step, policy version, reader position, counters
    .tmp-step-00000012-<pid>/   a checkpoint being written (removed on the next start)

Atomicity: everything is written into a temporary directory, every file and the directory are
fsynced, then one ``rename`` publishes it, and the parent directory is fsynced. A crash at any
point leaves either the previous set of checkpoints or the new one, never half of one; a
checkpoint directory without ``learner_state.json`` is never listed.

The reader position is the list of ready-stream entry ids trained since the previous
checkpoint. They are acknowledged only after this checkpoint is durable, and acknowledged
again (idempotent) on resume: see ``gspo_rl.learner.loop`` for the exactly-once argument.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

STATE_FILE = "learner_state.json"
TRAINER_FILE = "trainer_state.pt"
_DIR_RE = re.compile(r"^step-(\d{8,})$")
# Tokenizer files that save_pretrained of the model does not write.
_TOKENIZER_GLOBS = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab*",
                    "merges.txt", "*.model", "chat_template*")


class SaveDirError(ValueError):
    """A save directory that cannot be trained into as asked (checkpoints of another run, or
    of another kind of training)."""


@dataclass
class LearnerState:
    """The scalar state of a learner at a checkpoint."""

    step: int  # training steps done
    version: int  # policy version of the saved weights
    entry_ids: list[str] = field(default_factory=list)  # trained since the previous checkpoint
    groups_trained: int = 0
    created_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # "kind": "sft" for gspo sft's

    @property
    def kind(self) -> str:
        """What wrote the checkpoint: "learn" (RL) or "sft" (the supervised warm start)."""
        return str(self.extra.get("kind", "learn"))


@dataclass
class Checkpoint:
    """A complete checkpoint on disk."""

    path: Path
    state: LearnerState

    def trainer_state(self, map_location: str | torch.device = "cpu") -> dict[str, Any]:
        return load_trainer_state(self.path, map_location)


def load_trainer_state(
    path: str | Path, map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Optimiser, schedule and RNG states of the checkpoint directory ``path``.

    ``weights_only=True``: the file holds only tensors and plain containers (see
    ``capture_rng``), so whoever can write the save directory cannot make loading run code.
    """
    file = Path(path) / TRAINER_FILE
    try:
        return torch.load(file, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{file} holds more than tensors and plain containers (weights only "
                         "load refused it): not loaded, since unpickling it could run code. "
                         "Checkpoints written before weights_only loading keep their "
                         "weights (model.safetensors) but not the optimiser state") from exc


def capture_rng() -> dict[str, Any]:
    """Every RNG state as tensors and plain containers (loadable with ``weights_only=True``).

    numpy's MT19937 key becomes an int64 tensor; CUDA states (one per device) are CPU byte
    tensors, as ``torch.cuda.get_rng_state_all`` returns them.
    """
    kind, key, pos, has_gauss, cached = cast(  # legacy (the default): the tuple, not a dict
        "tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    version, py_state, gauss = random.getstate()
    rng: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "key": torch.from_numpy(key.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
        "python": {"version": int(version), "state": list(py_state), "gauss": gauss},
    }
    if torch.cuda.is_available():
        rng["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return rng


def _byte_state(t: torch.Tensor) -> torch.Tensor:
    """``torch.set_rng_state`` and ``torch.cuda.set_rng_state_all`` take CPU ByteTensors only;
    ``torch.load(map_location="cuda")`` moves every tensor of the file to the GPU."""
    return t.detach().to(device="cpu", dtype=torch.uint8)


def restore_rng(rng: dict[str, Any]) -> None:
    """Undo ``capture_rng`` (whatever device the states were loaded onto)."""
    torch.set_rng_state(_byte_state(rng["torch"]))
    n = rng["numpy"]
    np.random.set_state((n["kind"], n["key"].cpu().numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached"]))
    p = rng["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in rng and torch.cuda.is_available():
        states = [_byte_state(s) for s in rng["cuda"]]
        # A checkpoint from a machine with more GPUs restores the devices this one has.
        torch.cuda.set_rng_state_all(states[: torch.cuda.device_count()])


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            _fsync_path(Path(dirpath) / f)
        _fsync_path(Path(dirpath))


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    """Copy the tokenizer files of model directory ``src`` into ``dst``; returns their names."""
    copied: list[str] = []
    for pattern in _TOKENIZER_GLOBS:
        for f in sorted(src.glob(pattern)):
            if f.is_file() and not (dst / f.name).exists():
                shutil.copy2(f, dst / f.name)
                copied.append(f.name)
    return copied


def save_checkpoint(
    save_dir: str | Path,
    model: torch.nn.Module,
    trainer_state: dict[str, Any],
    state: LearnerState,
    tokenizer_src: str | Path | None = None,
    keep_last: int = 3,
) -> Path:
    """Write a checkpoint for ``state.step`` atomically; delete all but the newest
    ``keep_last``. Returns the checkpoint's directory."""
    root = Path(save_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{state.step:08d}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model.save_pretrained(tmp, safe_serialization=True)  # type: ignore[operator]  # nn.Module's attributes: Tensor | Module
    if tokenizer_src is not None:
        copy_tokenizer(Path(tokenizer_src), tmp)
    torch.save({**trainer_state, "rng": capture_rng()}, tmp / TRAINER_FILE)
    state.created_at = time.time()
    (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=1))
    _fsync_tree(tmp)
    final = root / name
    if final.exists():  # only after a crash that left the same step behind
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_path(root)
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old.path, ignore_errors=True)
    return final


def list_checkpoints(save_dir: str | Path) -> list[Checkpoint]:
    """Complete checkpoints, oldest first."""
    root = Path(save_dir)
    if not root.is_dir():
        return []
    out: list[Checkpoint] = []
    for d in root.iterdir():
        if _DIR_RE.match(d.name) and (d / STATE_FILE).is_file():
            out.append(Checkpoint(d, LearnerState(**json.loads((d / STATE_FILE).read_text()))))
    return sorted(out, key=lambda c: c.state.step)


def load_latest(save_dir: str | Path) -> Checkpoint | None:
    """The newest complete checkpoint, or ``None``."""
    cps = list_checkpoints(save_dir)
    return cps[-1] if cps else None


def remove_partial(save_dir: str | Path) -> list[str]:
    """Delete temporary directories left by a crash mid-save; returns their names."""
    root = Path(save_dir)
    if not root.is_dir():
        return []
    gone = [d.name for d in root.iterdir() if d.is_dir() and d.name.startswith(".tmp-step-")]
    for n in gone:
        shutil.rmtree(root / n, ignore_errors=True)
    return gone
