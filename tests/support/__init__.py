"""What the tests share, by concern; a test module imports helpers from here (or takes a
conftest fixture), never from another ``test_*.py`` module (tests/test_tests_layout.py).

- ``polling``: the one way to wait for a condition (``until``, ``wait_for``, ``retry_async``).
- ``raft_hosts``: ``RaftHost``s in one process over the in-memory twins.
- ``cluster``: real node processes on loopback (``LocalCluster``) and ``running``, the one
  way a test starts one and always stops it.
- ``fakes``: an in-process fake node for the SDK (gRPC servicers and their recordings).
- ``sim_net``: the core simulator's in-memory network of ``RaftNode``s.
"""
