"""The audit rules: each a named Spark computation over the audit tables giving findings.

A rule returns a DataFrame of findings with the columns of ``FINDING_DDL`` (stream, the
nodes concerned, a sequence or index range, a detail sentence); ``run_checks`` runs every
rule and collects at most ``FINDINGS_PER_RULE_MAX`` of each (the count is always exact).
Severity ``fail`` means the data is inconsistent; ``warn`` (lag) means a replica is behind,
which Raft allows and the replica repairs itself by catching up.

What "explained" means (gaps and missing messages): a stream's sequence may lack a message
because the log removed it, and the log says so: a ``DeleteMsg`` of that sequence, or a
``Purge``, ``Expire`` or rollup publish at a Raft index after the message's own entry (when
the message's entry is unknown, any such entry), or a limit of the stream that removes
messages on its own (``max_msgs``/``max_bytes``/``max_age`` below the first sequence,
``max_msgs_per_subject`` anywhere) or a retention that removes acknowledged messages
(``interest``, ``workqueue``). Anything else is loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

__all__ = [
    "FINDINGS_PER_RULE_MAX",
    "RULES",
    "AuditTables",
    "Finding",
    "RuleResult",
    "run_checks",
]

FINDINGS_PER_RULE_MAX = 200
_COLS = ("stream", "nodes", "lo", "hi", "detail")


@dataclass(frozen=True, slots=True)
class Finding:
    """One inconsistency: ``rule`` broken on ``stream`` (or Raft group) by ``nodes`` over
    sequences (or Raft indexes) ``lo``..``hi``, explained by ``detail``."""

    rule: str
    severity: str
    stream: str
    nodes: tuple[str, ...]
    lo: int | None
    hi: int | None
    detail: str


@dataclass(frozen=True, slots=True)
class RuleResult:
    """A rule's outcome: its exact finding ``count`` and the first findings."""

    rule: str
    severity: str
    description: str
    count: int
    findings: tuple[Finding, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class AuditTables:
    """The four tables (``tables.SCHEMAS``) and, optionally, a client history."""

    messages: DataFrame
    raft_log: DataFrame
    consumers: DataFrame
    streams: DataFrame
    history: DataFrame | None = None


# -- helpers ------------------------------------------------------------------------------


def _key(df: DataFrame) -> Column:
    """A stream's display name: ``account/stream`` (or just the stream without account)."""
    return F.when(F.coalesce(df["account"], F.lit("")) == "", df["stream"]).otherwise(
        F.concat_ws("/", df["account"], df["stream"])
    )


def _group_key(group: Column) -> Column:
    """The display name of a Raft group: a stream group ``S:<account>:<stream>`` shows as
    its stream (``account/stream``, as the message rules), any other group as itself."""
    return F.regexp_replace(group, "^S:([^:]*):", "$1/")


def _islands(df: DataFrame, keys: list[str], col: str) -> DataFrame:
    """Runs of consecutive ``col`` values per ``keys``: keys, lo, hi, n."""
    w = Window.partitionBy(*keys).orderBy(col)
    return (
        df.withColumn("_g", F.col(col) - F.row_number().over(w))
        .groupBy(*keys, "_g")
        .agg(F.min(col).alias("lo"), F.max(col).alias("hi"), F.count("*").alias("n"))
        .drop("_g")
    )


def _finding(
    df: DataFrame, stream: Column, nodes: Column, lo: Column, hi: Column, detail: Column
) -> DataFrame:
    return df.select(
        stream.alias("stream"),
        nodes.alias("nodes"),
        lo.cast("long").alias("lo"),
        hi.cast("long").alias("hi"),
        detail.alias("detail"),
    )


def _removals(t: AuditTables) -> DataFrame:
    """Per node and stream: the Raft index of the first purge/expire/rollup entry, or null."""
    return (
        t.raft_log.where(F.col("stream").isNotNull())
        .where(F.col("purge") | F.col("expire") | F.col("rollup"))
        .groupBy("node", "account", "stream")
        .agg(F.min("index").alias("removal_index"))
    )


def _deleted(t: AuditTables) -> DataFrame:
    """(node, account, stream, seq) of every ``DeleteMsg`` in the logs."""
    return t.raft_log.where(F.size("deleted_seqs") > 0).select(
        "node", "account", "stream", F.explode("deleted_seqs").alias("seq")
    )


def _self_trimming(s: DataFrame) -> Column:
    """True where the stream removes messages anywhere by itself (per-subject limit or a
    retention that removes acknowledged messages)."""
    per_subject = F.coalesce(s["max_msgs_per_subject"], F.lit(-1)) > 0
    return per_subject | (F.coalesce(s["retention"], F.lit("limits")) != "limits")


def _front_trimming(s: DataFrame) -> Column:
    """True where a limit removes the oldest messages (explains a hole below first_seq)."""
    return (
        (F.coalesce(s["max_msgs"], F.lit(-1)) > 0)
        | (F.coalesce(s["max_bytes"], F.lit(-1)) > 0)
        | (F.coalesce(s["max_age_ns"], F.lit(0)) > 0)
    )


# -- replicas -------------------------------------------------------------------------------


def replica_divergence(t: AuditTables) -> DataFrame:
    """Replicas holding different content at the same sequence (the minority is named)."""
    m = t.messages
    counts = m.groupBy("account", "stream", "seq", "hash").agg(F.count("*").alias("c"))
    w = Window.partitionBy("account", "stream", "seq").orderBy(F.desc("c"), "hash")
    major = (
        counts.withColumn("r", F.row_number().over(w))
        .where("r = 1")
        .select("account", "stream", "seq", F.col("hash").alias("major"))
    )
    odd = m.join(major, ["account", "stream", "seq"]).where(F.col("hash") != F.col("major"))
    runs = _islands(
        odd.select("account", "stream", "node", "seq"), ["account", "stream", "node"], "seq"
    )
    detail = F.format_string("%d message(s) differ from the other replicas' content", runs["n"])
    return _finding(runs, _key(runs), F.array(runs["node"]), runs["lo"], runs["hi"], detail)


def _node_positions(t: AuditTables) -> DataFrame:
    return t.streams.select(
        "node",
        "account",
        "stream",
        F.coalesce("first_seq", F.lit(0)).alias("node_first"),
        F.coalesce("last_seq", F.lit(0)).alias("node_last"),
        _self_trimming(t.streams).alias("self_trim"),
        _front_trimming(t.streams).alias("front_trim"),
    )


def missing_on_replica(t: AuditTables) -> DataFrame:
    """A sequence some replica holds, absent on another replica that has passed it (its
    last sequence is at or above it), with no removal in that replica's log to explain it."""
    keys = ["account", "stream", "seq"]
    present = t.messages.groupBy(*keys).agg(F.min("raft_index").alias("idx"))
    pos = _node_positions(t)
    cand = present.join(pos, ["account", "stream"]).where(F.col("seq") <= F.col("node_last"))
    held = t.messages.select("node", *keys)
    absent = cand.join(held, ["node", *keys], "left_anti")
    absent = absent.join(_deleted(t), ["node", *keys], "left_anti")
    absent = absent.join(_removals(t), ["node", "account", "stream"], "left")
    removed = F.col("removal_index").isNotNull() & (
        F.col("idx").isNull() | (F.col("removal_index") > F.col("idx"))
    )
    limited = F.col("self_trim") | (F.col("front_trim") & (F.col("seq") < F.col("node_first")))
    lost = absent.where(~removed & ~limited).select("node", "account", "stream", "seq")
    runs = _islands(lost, ["node", "account", "stream"], "seq")
    detail = F.format_string(
        "%d message(s) held by other replicas are missing below this replica's last sequence",
        runs["n"],
    )
    return _finding(runs, _key(runs), F.array(runs["node"]), runs["lo"], runs["hi"], detail)


def replica_lag(t: AuditTables) -> DataFrame:
    """A replica whose last sequence is behind the most advanced replica's (warning)."""
    s = t.streams.where(F.col("last_seq").isNotNull())
    top = s.groupBy("account", "stream").agg(F.max("last_seq").alias("top"))
    lag = s.join(top, ["account", "stream"]).where(F.col("last_seq") < F.col("top"))
    detail = F.format_string(
        "last sequence %d, %d behind the most advanced replica (commit index %d)",
        lag["last_seq"],
        lag["top"] - lag["last_seq"],
        F.coalesce(lag["commit"], F.lit(0)),
    )
    return _finding(lag, _key(lag), F.array(lag["node"]), lag["last_seq"] + 1, lag["top"], detail)


def unexplained_gap(t: AuditTables) -> DataFrame:
    """Sequences that no replica holds, below the highest last sequence, that no removal
    recorded in any replica's log explains (module docstring)."""
    keys = ["account", "stream"]
    seqs = t.messages.groupBy(*keys, "seq").agg(F.min("raft_index").alias("idx"))
    w = Window.partitionBy(*keys).orderBy("seq")
    inner = (
        seqs.withColumn("prev", F.lag("seq").over(w))
        .withColumn("prev_idx", F.lag("idx").over(w))
        .where(F.col("seq") - F.coalesce("prev", F.lit(0)) > 1)
        .select(
            *keys,
            (F.coalesce("prev", F.lit(0)) + 1).alias("lo"),
            (F.col("seq") - 1).alias("hi"),
            "prev_idx",
        )
    )
    s = t.streams
    info = s.groupBy(*keys).agg(
        F.max("last_seq").alias("top"),
        F.max(_self_trimming(s).cast("int")).alias("self_trim"),
        F.max(_front_trimming(s).cast("int")).alias("front_trim"),
    )
    last = seqs.groupBy(*keys).agg(F.max("seq").alias("held"), F.max("idx").alias("held_idx"))
    tail = (
        last.join(info, keys)
        .where(F.col("top") > F.col("held"))
        .select(
            *keys,
            (F.col("held") + 1).alias("lo"),
            F.col("top").alias("hi"),
            F.col("held_idx").alias("prev_idx"),
        )
    )
    gaps = inner.unionByName(tail).join(info, keys)
    return _explain_gaps(t, gaps)


def _explain_gaps(t: AuditTables, gaps: DataFrame) -> DataFrame:
    keys = ["account", "stream"]
    deleted = _deleted(t).select(*keys, "seq").distinct()
    covered = (
        gaps.join(deleted, keys)
        .where((F.col("seq") >= F.col("lo")) & (F.col("seq") <= F.col("hi")))
        .groupBy(*keys, "lo", "hi")
        .agg(F.count("*").alias("deleted"))
    )
    removal = _removals(t).groupBy(*keys).agg(F.max("removal_index").alias("removal_index"))
    g = gaps.join(covered, [*keys, "lo", "hi"], "left").join(removal, keys, "left")
    by_deletes = F.coalesce(g["deleted"], F.lit(0)) == g["hi"] - g["lo"] + 1
    by_removal = g["removal_index"].isNotNull() & (
        g["prev_idx"].isNull() | (g["removal_index"] > g["prev_idx"])
    )
    by_limits = (g["self_trim"] == 1) | ((g["front_trim"] == 1) & (g["lo"] == 1))
    bad = g.where(~(by_deletes | by_removal | by_limits))
    detail = F.format_string(
        "%d sequence(s) held by no replica, and no delete, purge or limit explains them",
        bad["hi"] - bad["lo"] + 1,
    )
    return _finding(bad, _key(bad), F.array().cast("array<string>"), bad["lo"], bad["hi"], detail)


# -- Raft logs ------------------------------------------------------------------------------


def _raft_ordered(t: AuditTables) -> DataFrame:
    w = Window.partitionBy("node", "group").orderBy("index")
    return t.raft_log.withColumn("prev_term", F.lag("term").over(w)).withColumn(
        "prev_index", F.lag("index").over(w)
    )


def raft_term_regression(t: AuditTables) -> DataFrame:
    """An entry whose term is below its predecessor's (Raft §5.3: terms never decrease
    along a log)."""
    r = _raft_ordered(t).where(F.col("term") < F.col("prev_term"))
    detail = F.format_string("term %d after term %d", r["term"], r["prev_term"])
    return _finding(r, _group_key(r["group"]), F.array(r["node"]), r["index"], r["index"], detail)


def raft_index_gap(t: AuditTables) -> DataFrame:
    """Indexes missing between two stored entries of a log (a log is contiguous)."""
    r = _raft_ordered(t).where(F.col("index") - F.col("prev_index") > 1)
    detail = F.format_string("%d entries missing", r["index"] - r["prev_index"] - 1)
    lo, hi = r["prev_index"] + 1, r["index"] - 1
    return _finding(r, _group_key(r["group"]), F.array(r["node"]), lo, hi, detail)


def raft_entry_mismatch(t: AuditTables) -> DataFrame:
    """Replicas whose committed entries differ at the same index (Log Matching, Raft §5.3:
    committed entries are identical on every replica). Entries above a replica's commit
    index are left out: an uncommitted suffix may still be replaced."""
    r = t.raft_log.where(F.col("index") <= F.col("commit"))
    counts = r.groupBy("group", "index", "term", "data_hash").agg(
        F.count("*").alias("c"), F.collect_list("node").alias("holders")
    )
    w = Window.partitionBy("group", "index").orderBy(F.desc("c"), "term", "data_hash")
    ranked = counts.withColumn("r", F.row_number().over(w)).withColumn(
        "versions", F.count("*").over(Window.partitionBy("group", "index"))
    )
    odd = ranked.where((F.col("versions") > 1) & (F.col("r") > 1))
    detail = F.format_string("holds term %d with other data than the other replicas", odd["term"])
    nodes = F.array_sort(odd["holders"])
    return _finding(odd, _group_key(odd["group"]), nodes, odd["index"], odd["index"], detail)


# -- messages -------------------------------------------------------------------------------


def duplicate_msg_id(t: AuditTables) -> DataFrame:
    """Two messages of a stream with the same msg id stamped within the stream's duplicate
    window (deduplication should have refused the second)."""
    keys = ["account", "stream"]
    m = (
        t.messages.where(F.col("msg_id").isNotNull())
        .select(*keys, "seq", "msg_id", "ts_ns")
        .distinct()
    )
    window = t.streams.groupBy(*keys).agg(F.max("duplicate_window_ns").alias("window"))
    w = Window.partitionBy(*keys, "msg_id").orderBy("seq")
    d = (
        m.withColumn("prev_seq", F.lag("seq").over(w))
        .withColumn("prev_ts", F.lag("ts_ns").over(w))
        .join(window, keys)
        .where(
            F.col("prev_seq").isNotNull() & (F.col("ts_ns") - F.col("prev_ts") < F.col("window"))
        )
    )
    detail = F.format_string(
        "msg id %s at sequences %d and %d, %d ms apart (window %d ms)",
        d["msg_id"],
        d["prev_seq"],
        d["seq"],
        ((d["ts_ns"] - d["prev_ts"]) / 1_000_000).cast("long"),
        (d["window"] / 1_000_000).cast("long"),
    )
    return _finding(d, _key(d), F.array().cast("array<string>"), d["prev_seq"], d["seq"], detail)


def _origin_messages(t: AuditTables, kind: str) -> tuple[DataFrame, DataFrame]:
    """(copies, origins): messages of mirror (or sourcing) streams with their origin, and the
    origin streams' messages (one row per sequence, any replica)."""
    s = t.streams
    if kind == "mirror":
        links = s.where(F.col("mirror").isNotNull()).select(
            "account", "stream", F.col("mirror").alias("origin")
        )
    else:
        links = s.where(F.col("sources").isNotNull()).select(
            "account", "stream", F.explode("sources").alias("origin")
        )
    links = links.distinct()
    copies = t.messages.where(F.col("origin_seq").isNotNull()).join(
        links.withColumnRenamed("origin", "origin_stream"), ["account", "stream", "origin_stream"]
    )
    origins = t.messages.select(
        "account",
        F.col("stream").alias("origin_stream"),
        F.col("seq").alias("origin_seq"),
        F.col("origin_hash").alias("want_hash"),
    ).distinct()
    return copies, origins.join(
        links.withColumnRenamed("origin", "origin_stream"), ["account", "origin_stream"]
    )


def mirror_mismatch(t: AuditTables) -> DataFrame:
    """A mirror must equal its origin: every origin message up to the last one mirrored is
    in the mirror, with the same content; a missing one is a gap, a different one a mismatch."""
    copies, origins = _origin_messages(t, "mirror")
    keys = ["account", "stream", "origin_stream"]
    got = copies.groupBy(*keys, "origin_seq").agg(F.collect_set("origin_hash").alias("hashes"))
    upto = copies.groupBy(*keys).agg(F.max("origin_seq").alias("upto"))
    o = origins.join(upto, keys).where(F.col("origin_seq") <= F.col("upto"))
    j = o.join(got, [*keys, "origin_seq"], "left")
    gap = j.where(F.col("hashes").isNull()).select(*keys, "origin_seq")
    runs = _islands(gap, keys, "origin_seq")
    gaps = _finding(
        runs,
        _key(runs),
        F.array().cast("array<string>"),
        runs["lo"],
        runs["hi"],
        F.format_string(
            "%d origin message(s) of %s missing from the mirror", runs["n"], runs["origin_stream"]
        ),
    )
    diff = j.where(F.col("hashes").isNotNull() & ~F.array_contains("hashes", F.col("want_hash")))
    diffs = _finding(
        diff,
        _key(diff),
        F.array().cast("array<string>"),
        diff["origin_seq"],
        diff["origin_seq"],
        F.format_string("content differs from origin %s", diff["origin_stream"]),
    )
    return gaps.unionByName(diffs)


def source_exactly_once(t: AuditTables) -> DataFrame:
    """A sourcing stream holds every origin message (up to the last one sourced) exactly
    once, identified by origin stream and sequence."""
    copies, origins = _origin_messages(t, "sources")
    keys = ["account", "stream", "origin_stream"]
    per_seq = copies.select(*keys, "origin_seq", "seq").distinct()
    counts = per_seq.groupBy(*keys, "origin_seq").agg(F.count("*").alias("copies"))
    upto = copies.groupBy(*keys).agg(F.max("origin_seq").alias("upto"))
    o = origins.join(upto, keys).where(F.col("origin_seq") <= F.col("upto"))
    j = o.join(counts, [*keys, "origin_seq"], "left").where(F.coalesce("copies", F.lit(0)) != 1)
    detail = F.format_string(
        "origin %s sequence held %d time(s)", j["origin_stream"], F.coalesce(j["copies"], F.lit(0))
    )
    return _finding(
        j, _key(j), F.array().cast("array<string>"), j["origin_seq"], j["origin_seq"], detail
    )


# -- consumers and history ------------------------------------------------------------------


def consumer_ack_floor(t: AuditTables) -> DataFrame:
    """A consumer's ack floor (or delivered sequence) beyond its stream's last sequence on
    the same replica."""
    c = t.consumers.join(
        t.streams.select("node", "account", "stream", "last_seq"), ["node", "account", "stream"]
    )
    bad = c.where(
        (F.col("ack_floor_stream_seq") > F.coalesce("last_seq", F.lit(0)))
        | (F.col("delivered_stream_seq") > F.coalesce("last_seq", F.lit(0)))
    )
    detail = F.format_string(
        "consumer %s: ack floor %d, delivered %d, stream last sequence %d",
        bad["consumer"],
        bad["ack_floor_stream_seq"],
        bad["delivered_stream_seq"],
        F.coalesce(bad["last_seq"], F.lit(0)),
    )
    return _finding(
        bad, _key(bad), F.array(bad["node"]), bad["ack_floor_stream_seq"], bad["last_seq"], detail
    )


def consumer_acked_pending(t: AuditTables) -> DataFrame:
    """A sequence both acknowledged (in the log) and still pending in the consumer's state;
    also a consumer whose ops the engine refused to replay."""
    c = t.consumers.withColumn("both", F.array_intersect("pending_seqs", "acked_seqs"))
    bad = c.where((F.size("both") > 0) | F.col("replay_error").isNotNull())
    detail = F.when(
        bad["replay_error"].isNotNull(),
        F.format_string("consumer %s: replay refused: %s", bad["consumer"], bad["replay_error"]),
    ).otherwise(
        F.format_string(
            "consumer %s: acked yet pending: %s", bad["consumer"], F.array_join(bad["both"], ",")
        )
    )
    lo, hi = F.array_min("both"), F.array_max("both")
    return _finding(bad, _key(bad), F.array(bad["node"]), lo, hi, detail)


def acked_publish_lost(t: AuditTables) -> DataFrame:
    """Every publish the client history records as acknowledged (``outcome`` ok) is stored
    on a quorum of the stream's replicas, with its msg id, unless the log removed it."""
    if t.history is None:
        return _empty(t.messages.sparkSession)
    h = t.history.where((F.col("op") == "publish") & (F.col("outcome") == "ok"))
    h = h.select("stream", F.col("seq").cast("long").alias("seq"), F.col("msg_id").alias("want_id"))
    replicas = t.streams.groupBy("account", "stream").agg(F.countDistinct("node").alias("replicas"))
    h = h.join(replicas, "stream")
    held = t.messages.select("account", "stream", "seq", "node", "msg_id")
    j = h.join(held, ["account", "stream", "seq"], "left").withColumn(
        "ok",
        F.col("node").isNotNull()
        & (F.col("want_id").isNull() | (F.col("want_id") == F.col("msg_id"))),
    )
    per = j.groupBy("account", "stream", "seq", "want_id", "replicas").agg(
        F.sum(F.col("ok").cast("int")).alias("holders"),
        F.array_sort(F.collect_set(F.when(F.col("ok"), F.col("node")))).alias("nodes"),
    )
    short = per.where(F.col("holders") < F.floor(F.col("replicas") / 2) + 1)
    gone = short.join(
        _deleted(t).select("account", "stream", "seq").distinct(),
        ["account", "stream", "seq"],
        "left_anti",
    )
    gone = gone.join(
        _removals(t).select("account", "stream").distinct(), ["account", "stream"], "left_anti"
    )
    detail = F.format_string(
        "acknowledged publish (msg id %s) on %d of %d replicas",
        F.coalesce(gone["want_id"], F.lit("-")),
        gone["holders"],
        gone["replicas"],
    )
    return _finding(gone, _key(gone), gone["nodes"], gone["seq"], gone["seq"], detail)


def _empty(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [], "stream STRING, nodes ARRAY<STRING>, lo BIGINT, hi BIGINT, detail STRING"
    )


# -- running --------------------------------------------------------------------------------

Rule = Callable[[AuditTables], DataFrame]
RULES: tuple[tuple[str, str, Rule], ...] = (
    ("replica_divergence", "fail", replica_divergence),
    ("missing_on_replica", "fail", missing_on_replica),
    ("replica_lag", "warn", replica_lag),
    ("unexplained_gap", "fail", unexplained_gap),
    ("raft_term_regression", "fail", raft_term_regression),
    ("raft_index_gap", "fail", raft_index_gap),
    ("raft_entry_mismatch", "fail", raft_entry_mismatch),
    ("duplicate_msg_id", "fail", duplicate_msg_id),
    ("mirror_mismatch", "fail", mirror_mismatch),
    ("source_exactly_once", "fail", source_exactly_once),
    ("consumer_ack_floor", "fail", consumer_ack_floor),
    ("consumer_acked_pending", "fail", consumer_acked_pending),
    ("acked_publish_lost", "fail", acked_publish_lost),
)


def _describe(rule: Rule) -> str:
    doc = (rule.__doc__ or "").strip()
    return " ".join(doc.split())


def run_checks(t: AuditTables, *, only: tuple[str, ...] = ()) -> list[RuleResult]:
    """Run every rule (or those named in ``only``) and collect their findings.

    One Spark job per rule: the findings are counted and ranked in that job (a rule's
    findings are few, so one partition holds them). A union of all rules in one job was
    measured slower: planning one very large query costs more than the jobs it saves.
    ``acked_publish_lost`` runs only with a history. The tables should be cached by the
    caller: every rule reads them again.
    """
    out: list[RuleResult] = []
    for name, severity, rule in RULES:
        if (only and name not in only) or (name == "acked_publish_lost" and t.history is None):
            continue
        everything = Window.partitionBy(F.lit(0))
        ranked = (
            rule(t)
            .withColumn("total", F.count("*").over(everything))
            .withColumn(
                "rank", F.row_number().over(everything.orderBy("stream", "lo", "hi", "detail"))
            )
        )
        rows = [r.asDict() for r in ranked.where(F.col("rank") <= FINDINGS_PER_RULE_MAX).collect()]
        rows.sort(key=lambda d: d["rank"])
        count = int(rows[0]["total"]) if rows else 0
        findings = tuple(_to_finding(name, severity, d) for d in rows)
        out.append(RuleResult(name, severity, _describe(rule), count, findings))
    return out


def _to_finding(rule: str, severity: str, row: dict[str, Any]) -> Finding:
    return Finding(
        rule=rule,
        severity=severity,
        stream=str(row["stream"]),
        nodes=tuple(n for n in (row["nodes"] or []) if n),
        lo=row["lo"],
        hi=row["hi"],
        detail=str(row["detail"]),
    )
