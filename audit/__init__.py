"""raftstream.audit: offline consistency audits of node data directories with Spark.

Modules: ``layout`` (node dirs, read-only opening, consistent copies), ``readers`` and
``logview`` (decoding the stores and Raft logs), ``tables`` (the four audit tables and their
partitions), ``source`` (the ``raftstream`` PySpark data source), ``export`` (Parquet),
``checks`` (the rules), ``report`` (screen, JSON, HTML), ``session`` (Spark setup), ``cli``
(the ``audit`` command group), ``synth`` (synthetic node dirs for tests and benchmarks).
See docs/audit.md.
"""
