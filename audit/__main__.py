"""``python -m raftstream.audit``: the ``audit`` command group on its own."""

from raftstream.audit.cli import audit

audit(prog_name="python -m raftstream.audit")
