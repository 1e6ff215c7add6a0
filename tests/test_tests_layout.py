"""The test tree is a library of its own (issue 34, part 4): what tests share lives in
``tests/support`` (or a conftest fixture), and no module under ``tests/`` imports a
``test_*.py`` module, so a test module can be moved, renamed or deleted without breaking
another. Imports are read with ``ast``, those inside functions included.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# Modules another change in flight still has importing a test module; each is to move to
# tests.support, then leave this list. Nothing else may join it.
PENDING: set[str] = set()


def _is_test_module(dotted: str) -> bool:
    return dotted.rsplit(".", 1)[-1].startswith("test_")


def _package_of(path: Path) -> list[str]:
    return list(path.relative_to(ROOT).with_suffix("").parts[:-1])


def _imported(path: Path, source: str) -> Iterator[tuple[int, str]]:
    """(line, dotted module) for every module ``source`` (the text of ``path``) imports;
    ``from X import name`` also yields ``X.name`` (``name`` may be a module)."""
    tree = ast.parse(source, filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(path)[: len(_package_of(path)) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def _test_module_imports() -> list[str]:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in PENDING:
            continue
        for line, module in _imported(path, path.read_text()):
            if module.startswith("tests.") and _is_test_module(module):
                found.append(f"{rel}:{line} imports {module}")
    return found


def test_no_module_under_tests_imports_a_test_module() -> None:
    assert _test_module_imports() == [], "import shared helpers from tests.support instead"


def test_the_check_sees_relative_absolute_and_nested_imports() -> None:
    """The reader resolves ``from .x``, ``from ..pkg import x``, and an import inside a
    function, the way Python does."""
    source = (
        "from .test_meta import state_with\n"
        "from ..raft import test_host\n"
        "def f():\n"
        "    import tests.sdk.test_kv\n"
        "from tests.support.polling import until\n"
    )
    at = TESTS / "cluster" / "test_sample.py"
    modules = {m for _, m in _imported(at, source) if _is_test_module(m)}
    assert modules == {"tests.cluster.test_meta", "tests.raft.test_host", "tests.sdk.test_kv"}
