"""The SDK's layering (docs/architecture.md "Layers"): the package root imports no grpc until the
SDK is used, and the SDK never imports the engine or the cluster. Checked in a fresh
interpreter so nothing another test imported leaks in."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import raftstream
assert "grpc" not in sys.modules, "importing raftstream pulled in grpc"
connect = raftstream.connect
assert "grpc" in sys.modules, "raftstream.connect did not load the SDK"
import raftstream.client, raftstream.pull, raftstream.publisher, raftstream.msg
bad = sorted(m for m in sys.modules if m.startswith(("raftstream.engine", "raftstream.cluster")))
assert not bad, f"the SDK imported {bad}"
print("ok", connect.__module__)
"""


def test_root_is_light_and_the_sdk_stays_off_engine_and_cluster():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], check=True, capture_output=True, text=True
    ).stdout
    assert out.split() == ["ok", "raftstream.client"]


def test_unknown_root_attributes_raise_attribute_error():
    import raftstream

    try:
        raftstream.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("raftstream.no_such_name resolved")
