"""What ``/proc`` says about a local process (Linux): whether it runs, its children, its CPU
time and its status fields.

Shared by the benchmarks (CPU per message), the soak (memory, threads, CPU over time) and
the tests that check no process outlives its launcher, about node processes they started.
"""

from __future__ import annotations

import os

__all__ = ["children", "cpu_seconds", "running", "status_kib"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first, then the parent
    pid, ...), or None when the process is gone. The name is in parentheses and may hold
    spaces and parentheses itself, so the fields start after the last ")"."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc/<pid>/stat (0 if gone)."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited: a zombie that no one has reaped
    yet (its parent gone, say) has."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def children(pid: int) -> set[int]:
    """The pids of the processes whose parent is ``pid`` now (zombies included)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and int(fields[1]) == pid:
                out.add(int(entry))
    return out


def status_kib(pid: int, *keys: str) -> dict[str, int] | None:
    """The first number of each of ``keys`` in /proc/<pid>/status (``VmRSS``, ``RssAnon``:
    KiB; ``Threads``: a count), or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in keys:
            out[key] = int(value.split()[0])
    return out
