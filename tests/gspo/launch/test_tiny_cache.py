"""gspo up's tiny model (gspo_rl.launch.tiny_cache): the first run builds it into the cache,
later runs copy it, byte for byte what the builder writes, without importing torch; a change of
seed builds another; a cache that cannot be written is passed by."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gspo_rl.launch import tiny_cache
from gspo_rl.tiny_model import make_tiny_model

REPO = Path(__file__).resolve().parents[3]


def files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def test_built_once_then_copied_byte_for_byte(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSPO_CACHE_DIR", str(tmp_path / "cache"))
    built = []
    real = tiny_cache._build
    monkeypatch.setattr(tiny_cache, "_build", lambda p, s: built.append(s) or real(p, s))
    first = tiny_cache.tiny_model(tmp_path / "run1" / "model", seed=0)
    second = tiny_cache.tiny_model(tmp_path / "run2" / "model", seed=0)
    other = tiny_cache.tiny_model(tmp_path / "run3" / "model", seed=1)
    assert built == [0, 1]  # the second run of seed 0 copied
    direct = make_tiny_model(tmp_path / "direct", seed=0)
    assert files(first) == files(second) == files(direct)
    assert files(other) != files(direct)
    assert tiny_cache.COMPLETE not in files(second)


def test_a_copy_imports_no_torch(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    probe = ("import sys; from pathlib import Path; from gspo_rl.launch.tiny_cache import "
             f"tiny_model; tiny_model(Path({str(tmp_path / 'run')!r}) / sys.argv[1]); "
             "print('torch' in sys.modules)")
    env = {"GSPO_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"}
    runs = [subprocess.run([sys.executable, "-c", probe, name], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120) for name in "ab"]
    assert [r.stdout.strip() for r in runs] == ["True", "False"], [r.stderr for r in runs]


def test_an_unwritable_cache_is_passed_by(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("GSPO_CACHE_DIR", str(blocked))
    model = tiny_cache.tiny_model(tmp_path / "run" / "model", seed=0)
    assert files(model) == files(make_tiny_model(tmp_path / "direct", seed=0))
