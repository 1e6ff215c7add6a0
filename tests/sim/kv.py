"""The simulator's state machine: a small key-value register map, one per group replica.

Commands carry their own CRC (on top of the storage checksum) so the state machine can
prove that what it applies is what a client proposed: applying a damaged command is a
checker failure, never silently accepted.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass


class CorruptCommandApplied(AssertionError):
    pass


@dataclass(frozen=True)
class Command:
    op_id: int
    kind: str  # "put" | "get" | "cas"
    key: str
    a: int = 0  # put: value; cas: expected
    b: int = 0  # cas: new value

    def encode(self) -> bytes:
        body = f"{self.op_id}|{self.kind}|{self.key}|{self.a}|{self.b}".encode()
        return body + zlib.crc32(body).to_bytes(4, "big")

    @classmethod
    def decode(cls, data: bytes) -> Command:
        body, crc = data[:-4], data[-4:]
        if len(data) < 5 or zlib.crc32(body).to_bytes(4, "big") != crc:
            raise CorruptCommandApplied(f"corrupted command applied: {data!r}")
        op_id, kind, key, a, b = body.decode().split("|")
        return cls(int(op_id), kind, key, int(a), int(b))


class KV:
    """Registers default to 0. ``apply`` returns the operation's result."""

    def __init__(self) -> None:
        self.data: dict[str, int] = {}

    def apply(self, cmd: Command) -> int | bool:
        cur = self.data.get(cmd.key, 0)
        if cmd.kind == "put":
            self.data[cmd.key] = cmd.a
            return True
        if cmd.kind == "get":
            return cur
        if cur == cmd.a:
            self.data[cmd.key] = cmd.b
            return True
        return False

    def snapshot(self) -> bytes:
        return json.dumps(self.data, sort_keys=True).encode()

    def restore(self, data: bytes) -> None:
        self.data = {str(k): int(v) for k, v in json.loads(data or b"{}").items()}
