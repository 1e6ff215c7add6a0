"""The audit's outputs: a summary table on screen (rich), a JSON report and a
self-contained HTML report (inline CSS and SVG, no external asset), plus the exit code.

The report is built from plain values (``AuditReport``) so every output shows the same
facts: each rule with its outcome and finding count, the first findings of each rule, and
per stream the position of every replica (first and last sequence, commit index).
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from raftstream.audit.checks import RuleResult

__all__ = ["AuditReport", "ReplicaPosition", "exit_code", "print_summary", "to_html", "to_json"]

_CHART_W, _BAR_H, _LABEL_W = 560, 18, 70


@dataclass(frozen=True, slots=True)
class ReplicaPosition:
    """Where one replica of a stream stands."""

    stream: str
    node: str
    first_seq: int
    last_seq: int
    commit: int


@dataclass(frozen=True, slots=True)
class AuditReport:
    """Everything an audit reports. ``source`` names the input read."""

    source: str
    results: tuple[RuleResult, ...]
    positions: tuple[ReplicaPosition, ...] = field(default=())
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return any(r.severity == "fail" and r.count for r in self.results)


def exit_code(report: AuditReport) -> int:
    """1 when any failing rule has a finding, 0 otherwise (warnings do not fail)."""
    return 1 if report.failed else 0


def _outcome(r: RuleResult) -> str:
    if not r.count:
        return "pass"
    return "FAIL" if r.severity == "fail" else "warn"


def print_summary(report: AuditReport, console: Console | None = None) -> None:
    """The rules and their outcomes, then the first findings of failing rules."""
    con = console or Console()
    table = Table(title=f"raftstream audit of {report.source}")
    for col in ("rule", "outcome", "findings"):
        table.add_column(col)
    styles = {"pass": "green", "FAIL": "bold red", "warn": "yellow"}
    for r in report.results:
        o = _outcome(r)
        table.add_row(r.rule, f"[{styles[o]}]{o}[/]", str(r.count))
    con.print(table)
    for r in report.results:
        for f in r.findings[:10]:
            where = f"{f.lo}..{f.hi}" if f.lo is not None else "-"
            nodes = ",".join(f.nodes) or "all"
            con.print(f"[bold]{r.rule}[/] {f.stream} nodes={nodes} range={where}: {f.detail}")
    rows = ", ".join(f"{k} {v}" for k, v in report.rows.items())
    con.print(f"{'FAILED' if report.failed else 'OK'} in {report.seconds:.1f}s ({rows})")


def to_json(report: AuditReport) -> str:
    """The report as JSON: ``source``, ``failed``, ``rules`` (with findings), ``positions``."""
    body: dict[str, Any] = {
        "source": report.source,
        "failed": report.failed,
        "seconds": round(report.seconds, 3),
        "rows": report.rows,
        "rules": [
            {
                "rule": r.rule,
                "severity": r.severity,
                "outcome": _outcome(r),
                "description": r.description,
                "count": r.count,
                "findings": [asdict(f) for f in r.findings],
            }
            for r in report.results
        ],
        "positions": [asdict(p) for p in report.positions],
    }
    return json.dumps(body, indent=2, sort_keys=True)


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
.pass{color:#1a7f37}.FAIL{color:#cf222e;font-weight:bold}.warn{color:#9a6700}
svg text{font-size:12px}
"""


def _chart(stream: str, positions: list[ReplicaPosition]) -> str:
    """An inline SVG bar per replica: its first..last sequence on a common scale."""
    top = max((p.last_seq for p in positions), default=0) or 1
    scale = (_CHART_W - _LABEL_W - 80) / top
    bars = []
    for i, p in enumerate(positions):
        y = i * (_BAR_H + 6)
        x0 = _LABEL_W + max(p.first_seq - 1, 0) * scale
        w = max((p.last_seq - max(p.first_seq - 1, 0)) * scale, 1)
        color = "#2da44e" if p.last_seq == top else "#d4a72c"
        bars.append(
            f'<text x="0" y="{y + 13}">{html.escape(p.node)}</text>'
            f'<rect x="{x0:.1f}" y="{y}" width="{w:.1f}" height="{_BAR_H}" fill="{color}"/>'
            f'<text x="{x0 + w + 4:.1f}" y="{y + 13}">{p.last_seq}</text>'
        )
    h = len(positions) * (_BAR_H + 6)
    title = html.escape(stream)
    return (
        f"<h3>{title}</h3>"
        f'<svg width="{_CHART_W}" height="{h}" role="img" '
        f'aria-label="replica positions of {title}">' + "".join(bars) + "</svg>"
    )


def to_html(report: AuditReport) -> str:
    """A self-contained HTML page: the rules, the findings, a chart of replica positions."""
    e = html.escape
    rules = "".join(
        f'<tr><td title="{e(r.description)}">{e(r.rule)}</td>'
        f'<td class="{_outcome(r)}">{_outcome(r)}</td><td>{r.count}</td></tr>'
        for r in report.results
    )
    findings = "".join(
        f"<tr><td>{e(f.rule)}</td><td>{e(f.stream)}</td><td>{e(','.join(f.nodes) or 'all')}</td>"
        f"<td>{f.lo if f.lo is not None else ''}..{f.hi if f.hi is not None else ''}</td>"
        f"<td>{e(f.detail)}</td></tr>"
        for r in report.results
        for f in r.findings
    )
    streams: dict[str, list[ReplicaPosition]] = {}
    for p in report.positions:
        streams.setdefault(p.stream, []).append(p)
    charts = "".join(
        _chart(s, sorted(ps, key=lambda p: p.node)) for s, ps in sorted(streams.items())
    )
    verdict = "FAILED" if report.failed else "OK"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>raftstream audit: {verdict}</title><style>{_CSS}</style></head><body>"
        f"<h1>raftstream audit: <span class='{'FAIL' if report.failed else 'pass'}'>"
        f"{verdict}</span></h1>"
        f"<p>Input {e(report.source)}; {report.seconds:.1f}s; "
        + e(", ".join(f"{k} {v} rows" for k, v in report.rows.items()))
        + "</p><h2>Rules</h2><table><tr><th>rule</th><th>outcome</th><th>findings</th></tr>"
        + rules
        + "</table><h2>Findings</h2><table><tr><th>rule</th><th>stream</th><th>nodes</th>"
        "<th>range</th><th>detail</th></tr>"
        + findings
        + "</table><h2>Replica positions (last sequence per node)</h2>"
        + charts
        + "</body></html>"
    )
