"""raftstream.bench: the benchmarks (``make bench``), each run as ``python -m``.

The benchmarks are programs, not a library: like the command line's entry point they apply
raftstream's gRPC settings (``raftstream.grpcenv``) before anything imports grpc, so that
their in-process clients run as the node and the command line do.
"""

from raftstream.grpcenv import apply_defaults

apply_defaults()
