"""Build a symlink view of the `raftstream` namespace for mypy.

pyproject.toml maps top-level folders into one import namespace (engine/ is
raftstream.engine, ...). The editable install resolves that with an import hook, which mypy
cannot follow, so `make typecheck` points mypy at this view instead. The mapping is read from
pyproject.toml, so the two never drift.
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path


def main(out: str) -> None:
    root = Path(__file__).resolve().parent.parent
    mapping: dict[str, str] = tomllib.loads((root / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"]
    view = root / out
    shutil.rmtree(view, ignore_errors=True)
    pkg = view / "raftstream"
    pkg.mkdir(parents=True)
    for entry in (root / mapping["raftstream"]).iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for name, folder in mapping.items():
        if name == "raftstream":
            continue
        (pkg / name.split(".", 1)[1]).symlink_to(root / folder, target_is_directory=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/typeview")
