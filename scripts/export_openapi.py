"""Write the rollout server's OpenAPI document to docs/openapi.json (the API reference).

    .venv/bin/python scripts/export_openapi.py [--check]

``--check`` exits 1 when the committed file differs from what the code generates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "openapi.json"


def generate() -> str:
    from gspo_rl.server.api.app import create_app
    from gspo_rl.server.config import ServerSettings

    app = create_app(ServerSettings(model="MODEL", served_model_name="MODEL"))
    return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = generate()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run scripts/export_openapi.py", file=sys.stderr)
            sys.exit(1)
        return
    OUT.write_text(text)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
