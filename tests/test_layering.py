"""The layers of docs/architecture.md are an import contract (pyproject.toml,
``[tool.importlinter]``), checked by ``make lint`` with import-linter. These tests show that
it holds on the tree and that it fails on a forbidden import, one made inside a function
included, in a copy of the tree with one module added."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _view(tmp_path: Path, *copied: str) -> Path:
    """The namespace's link view (tools/typeview.py), with the folders ``copied`` (as
    pyproject maps them: "engine", "raft") real copies that a test may add modules to."""
    view = tmp_path / "view"
    subprocess.run([sys.executable, str(ROOT / "tools/typeview.py"), str(view)], check=True)
    for folder in copied:
        link = view / "raftstream" / folder
        link.unlink()
        shutil.copytree(ROOT / folder, link, ignore=shutil.ignore_patterns("__pycache__"))
    return view


def _lint_imports(view: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=view,
        env={**os.environ, "PYTHONPATH": str(view)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    res = _lint_imports(_view(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


@pytest.mark.parametrize(
    ("folder", "module", "source", "broken", "chain"),
    [
        (
            "engine",
            "probe",
            "def load() -> None:\n    import raftstream.cluster.node.node\n",
            "engine is single-node semantics",
            "raftstream.engine.probe -> raftstream.cluster.node.node",
        ),
        (
            "raft",
            "core/probe",
            "import time\n",  # already loaded when Python starts: a runtime probe misses it
            "raft.core is a pure state machine",
            "raftstream.raft.core.probe -> time",
        ),
        (
            "raft",
            "probe",
            "def fail() -> None:\n    from raftstream.errors import UnavailableError\n",
            "raft is a library",
            "raftstream.raft.probe -> raftstream.errors",
        ),
        (
            "cluster",
            "meta/probe",
            "def leader() -> None:\n    from raftstream.cluster.stream.group import StreamGroup\n",
            "cluster/ is layered",
            "raftstream.cluster.meta.probe -> raftstream.cluster.stream.group",
        ),
        (
            "cluster",
            "common/probe",
            "from raftstream.tooling.localnet import free_port\n",
            "the node, the engine and Raft import no tooling",
            "raftstream.cluster.common.probe -> raftstream.tooling.localnet",
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, folder: str, module: str, source: str, broken: str, chain: str
) -> None:
    view = _view(tmp_path, folder)
    (view / "raftstream" / folder / f"{module}.py").write_text(source)
    res = _lint_imports(view)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{broken}" in res.stdout and "BROKEN" in res.stdout
    assert chain in res.stdout


@pytest.mark.parametrize("out", [".", "..", "tools", "kept"])
def test_the_view_builder_refuses_to_replace_what_it_did_not_make(tmp_path: Path, out: str) -> None:
    """tools/typeview.py removes its folder before building the view: given ``.`` it once
    removed a whole checkout, .git included. Run on a copy of the repository's top."""
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    shutil.copy(ROOT / "tools/typeview.py", repo / "tools")
    shutil.copy(ROOT / "pyproject.toml", repo)
    (repo / "raftstream").mkdir()
    (repo / "kept").mkdir()
    (repo / "kept" / "data").write_text("mine")
    res = subprocess.run(
        [sys.executable, str(repo / "tools/typeview.py"), out], capture_output=True, text=True
    )
    assert res.returncode != 0 and "typeview: refusing" in res.stderr
    assert (repo / "pyproject.toml").is_file() and (repo / "kept" / "data").read_text() == "mine"
    made = subprocess.run([sys.executable, str(repo / "tools/typeview.py"), "view"], check=True)
    assert made.returncode == 0 and (repo / "view" / "raftstream").is_dir()
