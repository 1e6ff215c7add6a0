"""The ``raftstream`` command line: ``main`` is the console-script entry point.

The commands are click groups in this package's modules (``app`` assembles them; ``stream``,
``consumer``, ``pub``, ``kv``, ``cluster``, ``bench``, ``auth``, with helpers in ``common``).
``main`` first applies raftstream's gRPC settings (``raftstream.grpcenv``): an entry point
may change process-wide state, and must before anything imports grpc, so it imports the
commands only after that.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """The console-script entry point (``raftstream = "raftstream.cli:main"``)."""
    from raftstream.grpcenv import apply_defaults

    apply_defaults()
    from raftstream.cli.app import run

    run(argv)
