"""A config file that is not UTF-8, or that nests thousands deep, is a named configuration
error and exit 2, as every other (docs/configuration.md; issue 39, finding 10): before, a
non-UTF-8 file and a deeply nested one crashed ``raftstream server --config`` with a
traceback and exit 1 (``UnicodeDecodeError``, ``RecursionError`` inside tomllib)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from raftstream.cluster.config import CONFIG_DEPTH_MAX, load_config
from raftstream.errors import InvalidArgumentError


def _server(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftstream.cluster", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"\xff\xfe[cluster]\n", "not UTF-8 at byte 0"),
        (b"[cluster]\nname = 'n1'\n# caf\xe9\n", "not UTF-8 at byte 27"),
        (b"[cluster]\nx = " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nesting deeper than"),
        (b"[cluster]\nx = " + b"{a=" * 5_000 + b"1" + b"}" * 5_000 + b"\n", "nesting deeper than"),
    ],
)
def test_a_config_file_of_bad_bytes_or_depth_is_a_named_error(
    tmp_path: Path, content: bytes, said: str
) -> None:
    config = tmp_path / "node.toml"
    config.write_bytes(content)
    res = _server(config)
    assert res.returncode == 2, res.stderr
    assert said in res.stderr and str(config) in res.stderr
    assert "Traceback" not in res.stderr


def test_the_depth_bound_counts_what_tomllib_parsed(tmp_path: Path) -> None:
    """Nesting too shallow for tomllib's recursion to fail is refused once parsed; a legal
    config's few levels pass."""
    config = tmp_path / "node.toml"
    deep = "[" * (CONFIG_DEPTH_MAX + 1) + "]" * (CONFIG_DEPTH_MAX + 1)
    config.write_text(f"[cluster]\nx = {deep}\n")
    with pytest.raises(InvalidArgumentError, match="nesting deeper than") as err:
        load_config(config)
    assert err.value.field == "config"
    shallow = "[" * 3 + "]" * 3
    config.write_text(f"[cluster]\nx = {shallow}\n")
    with pytest.raises(InvalidArgumentError, match=r"cluster\.x") as err:
        load_config(config)  # parsed: refused as an unknown key, not for its depth
