"""One stream group: its replicated state machine (``replica``), its leader side (the
``StreamGroup`` face in ``group`` and its parts: leadership, publishing, consumer decisions,
pulls, the poller, over a shared core), what it needs from its node (``deps``), its log
entries, snapshots and membership changes.
"""
