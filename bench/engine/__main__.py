"""Run every engine benchmark part present: ``python -m raftstream.bench.engine [PART ...]``.

Each part is a module of this package with a ``main(argv) -> int`` that prints its figures.
"""

from __future__ import annotations

import importlib
import sys

PARTS = ("store", "sublist", "consumer", "stream")


def main(argv: list[str]) -> int:
    wanted = [a for a in argv if not a.startswith("-")] or list(PARTS)
    flags = [a for a in argv if a.startswith("-")]
    rc = 0
    for part in wanted:
        if part not in PARTS:
            print(f"unknown part {part!r}; parts: {', '.join(PARTS)}", file=sys.stderr)
            return 2
        try:
            mod = importlib.import_module(f"raftstream.bench.engine.{part}")
        except ModuleNotFoundError as exc:
            if exc.name != f"raftstream.bench.engine.{part}":
                raise
            continue
        rc |= int(mod.main(flags))
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
