"""docker/Dockerfile (GPU) and docker/Dockerfile.cpu, checked without a Docker engine.

What can break silently without a build: a service pointing at a Dockerfile that is not
there, a COPY of a path that moved or that .dockerignore drops, a package of the project left
out of the image, the CPU image's torch drifting from the lock's pin, and the GPU image
letting pip replace the vLLM image's CUDA torch.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.compose import REPO, load_compose, mounts, required_variable


def package_folders() -> list[str]:
    """The folders setup.py installs as the gspo_rl namespace (its ``FOLDERS``)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    (folders,) = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                  and any(getattr(t, "id", None) == "FOLDERS" for t in n.targets)]
    return list(folders.values())


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def built_images() -> dict[str, dict[str, Any]]:
    """image tag -> build section, for every service that builds its image."""
    out: dict[str, dict[str, Any]] = {}
    for name, svc in load_compose()["services"].items():
        if "build" in svc:
            assert "image" in svc, f"{name} builds an image without a tag"
            prior = out.setdefault(svc["image"], svc["build"])
            assert prior == svc["build"], f"two builds tagged {svc['image']}"
    return out


def dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def test_services_build_from_dockerfiles_in_the_repository() -> None:
    builds = built_images()
    assert set(builds) == {"gspo-rl:gpu", "gspo-rl:cpu"}
    for build in builds.values():
        assert (REPO / build["context"] / build["dockerfile"]).is_file(), build


@pytest.mark.parametrize("dockerfile", ["docker/Dockerfile", "docker/Dockerfile.cpu"])
def test_images_copy_every_package_and_only_existing_paths(dockerfile: str) -> None:
    copies = [args.split() for op, args in instructions(REPO / dockerfile) if op == "COPY"]
    sources = [src.rstrip("/") for args in copies for src in args[:-1]
               if not src.startswith("--")]
    ignored = {p.rstrip("/") for p in dockerignore()}
    for src in sources:
        assert (REPO / src).exists(), f"{dockerfile} copies {src}, not in the repository"
        assert src not in ignored, f"{dockerfile} copies {src}, which .dockerignore drops"
    for folder in package_folders():
        assert folder in sources, f"{dockerfile} leaves out package folder {folder}"
    assert {"pyproject.toml", "setup.py"} <= set(sources)


def test_build_context_never_carries_keys_or_the_venv() -> None:
    ignored = {p.rstrip("/") for p in dockerignore()}
    assert {".env", ".venv", ".git"} <= ignored


def torch_pin() -> str:
    lock = (REPO / "requirements" / "lock.txt").read_text().splitlines()
    (pin,) = [d for d in lock if re.match(r"torch==", d)]
    return pin.split(";")[0].strip()


def test_cpu_image_installs_the_pinned_cpu_torch_first() -> None:
    steps = instructions(REPO / "docker" / "Dockerfile.cpu")
    assert steps[0] == ("FROM", "python:3.11-slim")
    runs = [args for op, args in steps if op == "RUN"]
    assert torch_pin() in runs[0] and "--index-url https://download.pytorch.org/whl/cpu" in \
        runs[0], "torch must come from the CPU index at the lock's pin, before the rest"
    assert any(re.search(r"pip install \.(\s|$)", r) for r in runs[1:])
    assert not any("redis-server" in r for r in runs), "Redis has its own container"


def test_gpu_image_keeps_the_vllm_images_cuda_torch() -> None:
    steps = instructions(REPO / "docker" / "Dockerfile")
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for op, a in steps if op == "ARG" and "=" in a}
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], dict(steps)["FROM"])
    assert base.startswith("vllm/vllm-openai:v"), base
    run = " ".join(a for op, a in steps if op == "RUN")
    assert "pip install --no-deps ." in run
    assert "install -c " in run, "the other dependencies install under the image's versions"
    assert "startswith('torch')" in run, "torch is filtered out of pyproject's dependencies"
    assert ("ENTRYPOINT", "[]") in steps, "vLLM's own server entrypoint must be cleared"


def test_mounts_exist_and_volumes_are_declared() -> None:
    raw = load_compose()
    for name, svc in raw["services"].items():
        for m in mounts(svc):
            if m.type == "volume":
                assert m.source in raw.get("volumes", {}), f"{name}: volume {m.source}"
            elif m.source.startswith("./"):
                src = REPO / m.source
                assert src.exists(), f"{name} mounts {m.source}, missing from the repository"
                if Path(m.target).suffix:
                    assert src.is_file(), f"{name}: {m.source} should be a file"
            else:
                assert required_variable(m.source), f"{name}: {m.source} from the user's .env"
