"""gRPC's process-wide settings that raftstream's own programs choose: applied by the
command line (``raftstream ...``, ``python -m raftstream.cluster``) and the benchmarks, never
by ``import raftstream``.

gRPC's C core reads its environment once, when grpc is first imported, so
``apply_defaults()`` must run before anything imports grpc; it sets each variable only when
the environment does not set it already (the user's setting always wins):

- ``GRPC_VERBOSITY=ERROR``: the core logs to stderr on its own, INFO lines included
  (``Got goaway`` each time a server closes a connection a client holds open); set it to
  ``INFO`` or ``DEBUG`` to see the core's own lines.
- ``GRPC_EXPERIMENTS`` (``GRPC_EXPERIMENTS_DEFAULT``), with grpcio 1.85 only: its client
  and listener I/O on the core's older engine (iomgr) rather than the EventEngine ones it
  uses by default, which cost each call more CPU and thread hand-offs (measured:
  docs/configuration.md, "gRPC's I/O engine"). Other grpcio versions are left alone (the
  names may differ there); set ``GRPC_EXPERIMENTS`` (even to an empty string) to choose.

An application using the SDK may call ``raftstream.grpcenv.apply_defaults()`` first thing in
its own ``main`` for the same settings; importing the SDK leaves the process as it was.
"""

from __future__ import annotations

import importlib.util
import os
import re

__all__ = [
    "GRPC_EXPERIMENTS_DEFAULT",
    "GRPC_EXPERIMENTS_TESTED",
    "apply_defaults",
    "grpcio_version",
]

GRPC_EXPERIMENTS_DEFAULT = (
    "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"
)
GRPC_EXPERIMENTS_TESTED = (1, 85)  # the grpcio (major, minor) that default was measured on


def grpcio_version() -> tuple[int, int] | None:
    """grpcio's (major, minor), read without importing grpc (importlib.metadata takes tens
    of milliseconds; this file, a fraction of one); None when unknown."""
    try:
        spec = importlib.util.find_spec("grpc")
        if spec is None or spec.origin is None:
            return None
        path = os.path.join(os.path.dirname(spec.origin), "_grpcio_metadata.py")
        with open(path, encoding="utf-8") as f:
            found = re.search(r"(\d+)\.(\d+)", f.read())
    except (OSError, ImportError, ValueError):
        return None
    return (int(found[1]), int(found[2])) if found else None


def apply_defaults() -> None:
    """Set ``GRPC_VERBOSITY`` and (grpcio 1.85) ``GRPC_EXPERIMENTS`` where the environment
    does not (module docstring). Has no effect on a grpc already imported."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    if "GRPC_EXPERIMENTS" not in os.environ and grpcio_version() == GRPC_EXPERIMENTS_TESTED:
        os.environ["GRPC_EXPERIMENTS"] = GRPC_EXPERIMENTS_DEFAULT
