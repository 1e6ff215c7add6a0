"""raftstream's own tooling, outside the SDK's namespace: what the command line, the
benchmarks, the chaos harness and the tests share to run nodes on this machine.

- ``localcluster``: start and stop a local cluster of node processes (``make run``,
  ``raftstream run``), and wait for it to be ready.
- ``localnet``: free loopback ports and polling until something is ready.
- ``procfs``: a process's CPU time and memory from /proc.
- ``certs``: a throw-away CA and certificates (``raftstream certs``).

The SDK imports none of it (contract ``sdk``, docs/architecture.md).
"""
