"""``python -m raftstream.cluster``: the ``raftstream server`` command (see ``raftstream.cli``)."""

from __future__ import annotations

from raftstream.cli import main

if __name__ == "__main__":
    main(["server", *__import__("sys").argv[1:]])
