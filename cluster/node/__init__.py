"""The node process: the ``Node`` face and its parts (the gRPC server, storage, peers,
the stream groups' lifecycle, the per-tick monitor, the way into the meta group), assembled
from every other package here. The top layer of cluster/ (docs/architecture.md).
"""
