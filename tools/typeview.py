"""Build a symlink view of the `raftstream` namespace for mypy.

pyproject.toml maps top-level folders into one import namespace (engine/ is
raftstream.engine, ...). The editable install resolves that with an import hook, which mypy
cannot follow, so `make typecheck` points mypy at this view instead. The mapping is read from
pyproject.toml, so the two never drift.

The view is rebuilt from scratch, so its folder is removed first: only a folder this script
made (it holds the marker file ``.typeview``), one inside ``build/``, or a new or empty
one. Anything else, the repository itself above all, is refused (a view asked for at ``.``
once removed a whole checkout, its ``.git`` included).
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

MARKER = ".typeview"


def _check_replaceable(view: Path, root: Path) -> None:
    """Refuse to remove ``view`` unless it is a view made here, or new, or empty."""
    if view == root or root.is_relative_to(view):
        raise SystemExit(f"typeview: refusing {view}: it holds the repository")
    if view.is_relative_to(root / "build") and view != root / "build":
        return  # the ignored scratch folder (a view made before the marker existed)
    if view.is_dir() and any(view.iterdir()) and not (view / MARKER).is_file():
        raise SystemExit(
            f"typeview: refusing {view}: not empty and not a view this script made "
            f"(no {MARKER}); name a new folder, such as build/typeview"
        )


def main(out: str) -> None:
    root = Path(__file__).resolve().parent.parent
    mapping: dict[str, str] = tomllib.loads((root / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"]
    view = (root / out).resolve()
    _check_replaceable(view, root)
    shutil.rmtree(view, ignore_errors=True)
    pkg = view / "raftstream"
    pkg.mkdir(parents=True)
    (view / MARKER).write_text("made by tools/typeview.py; removed and rebuilt by it\n")
    for entry in (root / mapping["raftstream"]).iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for name, folder in mapping.items():
        if name == "raftstream":
            continue
        (pkg / name.split(".", 1)[1]).symlink_to(root / folder, target_is_directory=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/typeview")
