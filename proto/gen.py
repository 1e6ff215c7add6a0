"""Regenerate the protobuf and gRPC stubs of every ``proto/*.proto`` (``make proto``).

The .proto files are compiled under the virtual path ``raftstream/proto`` so the generated
modules import each other as ``raftstream.proto.x_pb2``, matching the installed namespace.
mypy-protobuf writes the ``.pyi`` stubs beside them.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path


def main() -> int:
    from grpc_tools import protoc  # dev dependency, only needed to regenerate

    here = Path(__file__).resolve().parent
    protos = sorted(p.name for p in here.glob("*.proto"))
    if not protos:
        print("no .proto files", file=sys.stderr)
        return 0
    include = str(Path(protoc.__file__).parent / "_proto")
    with tempfile.TemporaryDirectory() as out:
        args = [
            "protoc",
            f"-Iraftstream/proto={here}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--mypy_out={out}",
            f"--mypy_grpc_out={out}",
            *[f"raftstream/proto/{name}" for name in protos],
        ]
        rc = protoc.main(args)
        if rc != 0:
            return int(rc)
        for f in (Path(out) / "raftstream" / "proto").iterdir():
            shutil.copy(f, here / f.name)
    print(f"generated stubs for {', '.join(protos)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
