"""SubList: routing trie, queue groups, pruning, the generation-stamped match cache, remote
interest and stats (issue 2, part 2).

The model throughout is the brute force the trie must agree with: a subscription matches a
literal subject exactly when ``subject_matches(sub.subject, subject)``.
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Hashable, Iterable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from raftstream.engine.subjects import subject_matches
from raftstream.engine.sublist import (
    CACHE_ENTRIES_MAX,
    RemoteKey,
    RemoteMatch,
    SubList,
    SubListResult,
    Subscription,
)
from raftstream.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    InvariantError,
    NotFoundError,
)

# ---------------------------------------------------------------------------------------------
# Helpers: the brute-force model


def _sub(subject: str, sid: Hashable = 1, queue: str | None = None) -> Subscription:
    return Subscription(subject=subject, sid=sid, queue=queue)


def _expected(subs: Iterable[Subscription], subject: str) -> tuple[set[Subscription], dict]:
    """Brute force: every live subscription whose filter matches, split plain / by queue."""
    plain: set[Subscription] = set()
    queues: dict[str, set[Subscription]] = {}
    for s in subs:
        if subject_matches(s.subject, subject):
            if s.queue is None:
                plain.add(s)
            else:
                queues.setdefault(s.queue, set()).add(s)
    return plain, queues


def _as_sets(result: SubListResult) -> tuple[set[Subscription], dict]:
    """A result in set form; also checks it holds no duplicates."""
    plain = set(result.plain)
    assert len(plain) == len(result.plain), "a subscription appeared twice"
    queues = {}
    for name, members in result.queues.items():
        queues[name] = set(members)
        assert len(queues[name]) == len(members), "a queue member appeared twice"
        assert members, "an empty queue group was reported"
    return plain, queues


def _expected_remote(weights: dict[RemoteKey, int], account: str, subject: str) -> RemoteMatch:
    """Brute force over every remote key of the account."""
    plain: set[str] = set()
    queues: dict[str, dict[str, int]] = {}
    for key, weight in weights.items():
        if key.account != account or not subject_matches(key.subject, subject):
            continue
        if key.queue is None:
            plain.add(key.route)
        else:
            per_route = queues.setdefault(key.queue, {})
            per_route[key.route] = per_route.get(key.route, 0) + weight
    return RemoteMatch(plain_routes=tuple(sorted(plain)), queue_weights=queues)


def _remote_as_plain(m: RemoteMatch) -> tuple[tuple[str, ...], dict[str, dict[str, int]]]:
    return m.plain_routes, {q: dict(w) for q, w in m.queue_weights.items()}


# ---------------------------------------------------------------------------------------------
# Matching and queue groups


def test_literal_subscription_matches_only_its_subject() -> None:
    """A literal filter matches exactly its subject: not a prefix, not an extension."""
    sl = SubList()
    s = _sub("orders.eu")
    sl.insert(s)
    assert sl.match("orders.eu").plain == (s,)
    assert sl.match("orders").plain == ()
    assert sl.match("orders.eu.new").plain == ()
    assert sl.match("orders.us").plain == ()


def test_single_token_wildcard_matches_exactly_one_token() -> None:
    """``*`` matches any one token at its position, never zero or two."""
    sl = SubList()
    mid, last = _sub("a.*.c"), _sub("a.*")
    sl.insert(mid)
    sl.insert(last)
    assert set(sl.match("a.b.c").plain) == {mid}
    assert set(sl.match("a.x").plain) == {last}
    assert sl.match("a").plain == ()
    assert sl.match("a.b.c.d").plain == ()


def test_full_wildcard_matches_one_or_more_trailing_tokens() -> None:
    """``>`` matches one or more tokens after its prefix; ``>`` alone matches everything."""
    sl = SubList()
    tail, every = _sub("a.>"), _sub(">")
    sl.insert(tail)
    sl.insert(every)
    assert set(sl.match("a.b").plain) == {tail, every}
    assert set(sl.match("a.b.c.d").plain) == {tail, every}
    assert set(sl.match("a").plain) == {every}
    assert set(sl.match("z").plain) == {every}


def test_overlapping_filters_all_match_once_each() -> None:
    """Every matching filter contributes its subscriptions once, whatever path reaches it."""
    sl = SubList()
    subs = [_sub(f, sid=i) for i, f in enumerate(["a.b.c", "a.*.c", "*.b.*", "a.>", "*.*.*"])]
    for s in subs:
        sl.insert(s)
    sl.insert(_sub("a.b", sid=9))
    assert set(sl.match("a.b.c").plain) == set(subs)


def test_same_filter_different_sids_are_distinct_subscriptions() -> None:
    """Subscriptions are identified by (subject, sid, queue); two owners may share a filter."""
    sl = SubList()
    one, two = _sub("a", sid="c1"), _sub("a", sid="c2")
    sl.insert(one)
    sl.insert(two)
    assert set(sl.match("a").plain) == {one, two}
    sl.remove(one)
    assert sl.match("a").plain == (two,)


def test_queue_subscriptions_are_grouped_by_queue_name() -> None:
    """Queue members are reported per group, apart from plain subscribers; fanout counts one
    delivery per plain subscriber and one per queue group."""
    sl = SubList()
    plain = _sub("jobs.*", sid="p")
    w1, w2 = (
        _sub("jobs.build", sid="w1", queue="workers"),
        _sub("jobs.*", sid="w2", queue="workers"),
    )
    audit = _sub("jobs.>", sid="a1", queue="audit")
    for s in (plain, w1, w2, audit):
        sl.insert(s)
    result = sl.match("jobs.build")
    assert result.plain == (plain,)
    assert {k: set(v) for k, v in result.queues.items()} == {"workers": {w1, w2}, "audit": {audit}}
    assert result.fanout == 3
    assert len(result) == 4
    other = sl.match("jobs.test")
    assert {k: set(v) for k, v in other.queues.items()} == {"workers": {w2}, "audit": {audit}}


def test_results_are_immutable() -> None:
    """Results are shared through the cache, so they cannot be changed by a caller."""
    sl = SubList()
    sl.insert(_sub("a", queue="q"))
    result = sl.match("a")
    with pytest.raises(TypeError):
        result.queues["x"] = ()  # type: ignore[index]
    with pytest.raises(AttributeError):
        result.plain = ()  # type: ignore[misc]


def test_no_match_is_empty() -> None:
    sl = SubList()
    result = sl.match("nothing.here")
    assert result.plain == ()
    assert dict(result.queues) == {}
    assert result.fanout == 0


@pytest.mark.parametrize("subject", ["a.*", "a.>", "", "a..b", "a b"])
def test_match_refuses_filters_and_invalid_subjects(subject: str) -> None:
    """match takes a literal subject (what is published); anything else is an
    InvalidArgumentError, and is neither counted nor cached."""
    sl = SubList()
    sl.insert(_sub(">"))
    with pytest.raises(InvalidArgumentError):
        sl.match(subject)
    stats = sl.stats()
    assert stats.matches == 0
    assert stats.cache_entries == 0


def test_deep_subjects_do_not_hit_the_recursion_limit() -> None:
    """A valid filter may have ~2000 ``*`` tokens (4096 bytes): matching, pruning and the
    debug walk must handle that depth (Python's recursion limit is 1000)."""
    depth = 1500
    sl = SubList()
    stars, literal = _sub(".".join(["*"] * depth)), _sub(".".join(["a"] * depth), sid=2)
    sl.insert(stars)
    sl.insert(literal)
    assert set(sl.match(".".join(["a"] * depth)).plain) == {stars, literal}
    assert sl.match(".".join(["b"] * depth)).plain == (stars,)
    sl.check_invariants()
    sl.remove(stars)
    sl.remove(literal)
    assert sl.stats().nodes == 0


def test_subscription_validates_its_subject_and_queue() -> None:
    """A Subscription value is always well formed."""
    with pytest.raises(InvalidArgumentError):
        _sub("a..b")
    with pytest.raises(InvalidArgumentError):
        _sub(">.a")
    with pytest.raises(InvalidArgumentError):
        _sub("a", queue="")


# ---------------------------------------------------------------------------------------------
# Insert / remove and pruning


def test_duplicate_insert_and_missing_remove_are_typed_errors() -> None:
    """Inserting an equal subscription twice is AlreadyExistsError; removing one that is not
    there (including the same filter in another queue) is NotFoundError; neither counts."""
    sl = SubList()
    s = _sub("a.b", queue="q")
    sl.insert(s)
    with pytest.raises(AlreadyExistsError):
        sl.insert(_sub("a.b", queue="q"))
    with pytest.raises(NotFoundError):
        sl.remove(_sub("a.b"))
    with pytest.raises(NotFoundError):
        sl.remove(_sub("a.b", queue="other"))
    stats = sl.stats()
    assert (stats.inserts, stats.removes, stats.subscriptions) == (1, 0, 1)
    sl.remove(s)
    with pytest.raises(NotFoundError):
        sl.remove(s)


def test_removing_everything_prunes_every_node() -> None:
    """Remove prunes nodes left empty on the way back up: no subscriptions, no nodes."""
    sl = SubList()
    filters = ["a", "a.b", "a.b.c", "a.*.c", "a.>", "*", ">", "*.*.>", "x.y.z.w", "a.b.c"]
    subs = [_sub(f, sid=i, queue=None if i % 3 else "q") for i, f in enumerate(filters)]
    for s in subs:
        sl.insert(s)
    assert sl.stats().nodes > 0
    for s in reversed(subs):
        sl.remove(s)
        sl.check_invariants()
    assert sl.stats().nodes == 0
    assert sl.stats().subscriptions == 0


def test_pruning_keeps_nodes_still_in_use() -> None:
    """Removing a long filter keeps the shared prefix a shorter filter still ends at."""
    sl = SubList()
    short, long_ = _sub("a.b"), _sub("a.b.c.d")
    sl.insert(short)
    sl.insert(long_)
    assert sl.stats().nodes == 4
    sl.remove(long_)
    assert sl.stats().nodes == 2
    sl.check_invariants()
    assert sl.match("a.b").plain == (short,)


def test_emptied_queue_group_disappears() -> None:
    """The last member leaving a queue group removes the group from results."""
    sl = SubList()
    plain, member = _sub("a"), _sub("a", sid=2, queue="q")
    sl.insert(plain)
    sl.insert(member)
    sl.remove(member)
    sl.check_invariants()
    assert dict(sl.match("a").queues) == {}


def test_check_invariants_detects_a_broken_counter() -> None:
    """The debug walk is a real check: a node counter out of step with the trie raises."""
    sl = SubList()
    sl.insert(_sub("a.b"))
    sl._trie.nodes += 1  # white-box: simulate a pruning bookkeeping bug
    with pytest.raises(InvariantError):
        sl.check_invariants()


# ---------------------------------------------------------------------------------------------
# The match cache


def test_repeated_match_is_a_cache_hit_returning_the_same_result() -> None:
    """A second match of a subject with no mutation in between is served from the cache."""
    sl = SubList()
    sl.insert(_sub("a.*"))
    first = sl.match("a.b")
    second = sl.match("a.b")
    assert second is first
    stats = sl.stats()
    assert (stats.matches, stats.cache_hits, stats.cache_entries) == (2, 1, 1)
    assert stats.cache_hit_rate == pytest.approx(0.5)


def test_insert_invalidates_cached_results() -> None:
    """An insert bumps the generation: a cached result computed before it is not served."""
    sl = SubList()
    old = _sub("a.*")
    sl.insert(old)
    assert sl.match("a.b").plain == (old,)
    generation = sl.stats().generation
    new = _sub("a.b", sid=2)
    sl.insert(new)
    assert sl.stats().generation > generation
    assert set(sl.match("a.b").plain) == {old, new}
    assert sl.stats().cache_hits == 0


def test_remove_invalidates_cached_results() -> None:
    """A remove bumps the generation: the removed subscription is never served again."""
    sl = SubList()
    gone, stays = _sub("a.>"), _sub("a.b", sid=2)
    sl.insert(gone)
    sl.insert(stays)
    assert set(sl.match("a.b").plain) == {gone, stays}
    sl.remove(gone)
    assert sl.match("a.b").plain == (stays,)
    assert sl.stats().cache_hits == 0


def test_stale_entry_is_refreshed_then_hit_again() -> None:
    """A stale entry is recomputed on lookup and stamped anew, so the next lookup hits."""
    sl = SubList()
    sl.insert(_sub("a"))
    sl.match("a")
    sl.insert(_sub("b"))  # unrelated, but any mutation makes every entry stale
    refreshed = sl.match("a")
    assert sl.stats().cache_hits == 0
    assert sl.match("a") is refreshed
    assert sl.stats().cache_hits == 1


def test_cache_is_bounded_and_swept_oldest_first() -> None:
    """Past cache_entries_max the cache is swept back to max - sweep; the oldest-inserted
    entries go and the newest stays."""
    sl = SubList(cache_entries_max=8, cache_sweep_entries=4)
    sl.insert(_sub(">"))
    for i in range(8):
        sl.match(f"s.{i}")
    assert sl.stats().cache_entries == 8
    sl.match("s.8")  # the ninth entry overflows the bound
    assert sl.stats().cache_entries == 4
    hits = sl.stats().cache_hits
    sl.match("s.8")
    assert sl.stats().cache_hits == hits + 1, "the newest entry survives the sweep"
    sl.match("s.0")
    assert sl.stats().cache_hits == hits + 1, "the oldest entry was swept"


def test_sweep_drops_stale_entries_first() -> None:
    """Stale entries are useless, so a sweep removes them before any current one."""
    sl = SubList(cache_entries_max=4, cache_sweep_entries=2)
    for i in range(4):
        sl.match(f"s.{i}")
    sl.insert(_sub("x"))  # every cached entry is now stale
    sl.match("s.new")
    assert sl.stats().cache_entries == 1
    sl.match("s.new")
    assert sl.stats().cache_hits == 1


def test_default_cache_bound_holds_under_many_distinct_subjects() -> None:
    """The default cache never holds more than CACHE_ENTRIES_MAX (1024) entries."""
    sl = SubList()
    sl.insert(_sub("t.>"))
    for i in range(3 * CACHE_ENTRIES_MAX):
        sl.match(f"t.{i}")
        assert sl.stats().cache_entries <= CACHE_ENTRIES_MAX
    assert CACHE_ENTRIES_MAX == 1024
    sl.check_invariants()


def test_cache_can_be_disabled() -> None:
    """cache_entries_max=0 turns caching off: every match walks the trie."""
    sl = SubList(cache_entries_max=0)
    sl.insert(_sub("a"))
    sl.match("a")
    sl.match("a")
    stats = sl.stats()
    assert (stats.cache_entries, stats.cache_hits, stats.matches) == (0, 0, 2)


@pytest.mark.parametrize(("entries", "sweep"), [(-1, 1), (8, 0), (8, 9)])
def test_cache_limits_are_validated(entries: int, sweep: int) -> None:
    with pytest.raises(InvalidArgumentError):
        SubList(cache_entries_max=entries, cache_sweep_entries=sweep)


# ---------------------------------------------------------------------------------------------
# Remote interest


def _rk(route: str, subject: str, queue: str | None = None, account: str = "A") -> RemoteKey:
    return RemoteKey(route=route, account=account, subject=subject, queue=queue)


def test_remote_interest_is_per_account_and_wildcard_aware() -> None:
    """has_remote_interest matches remote filters against a literal subject, per account."""
    sl = SubList()
    sl.add_remote_interest(_rk("r1", "orders.*"))
    assert sl.has_remote_interest("A", "orders.eu")
    assert not sl.has_remote_interest("A", "orders.eu.x")
    assert not sl.has_remote_interest("B", "orders.eu")
    assert sl.match("orders.eu").plain == (), "remote interest is not local interest"


def test_match_remote_returns_routes_and_summed_queue_weights() -> None:
    """match_remote names each interested route once, and per queue each route's weight,
    summed over its matching queue interest."""
    sl = SubList()
    sl.add_remote_interest(_rk("r1", "orders.>"))
    sl.add_remote_interest(_rk("r2", "orders.*", queue="workers"), weight=3)
    sl.add_remote_interest(_rk("r2", "orders.eu", queue="workers"), weight=2)
    sl.add_remote_interest(_rk("r3", "orders.eu", queue="workers"), weight=1)
    sl.add_remote_interest(_rk("r3", "orders.us", queue="workers"), weight=7)
    sl.add_remote_interest(_rk("r4", "orders.eu", account="B"))
    m = sl.match_remote("A", "orders.eu")
    assert m.plain_routes == ("r1",)
    assert {q: dict(w) for q, w in m.queue_weights.items()} == {"workers": {"r2": 5, "r3": 1}}
    assert m.routes == ("r1", "r2", "r3")


def test_remote_weight_add_update_and_replace() -> None:
    """Adding a present key replaces its weight; update_remote_weight needs a present queue
    key; weights are integers >= 1, and plain interest has weight 1."""
    sl = SubList()
    key = _rk("r1", "a", queue="q")
    sl.add_remote_interest(key, weight=2)
    sl.add_remote_interest(key, weight=4)
    assert dict(sl.match_remote("A", "a").queue_weights["q"]) == {"r1": 4}
    sl.update_remote_weight(key, 9)
    assert dict(sl.match_remote("A", "a").queue_weights["q"]) == {"r1": 9}
    assert sl.stats().remote_interests == 1
    with pytest.raises(NotFoundError):
        sl.update_remote_weight(_rk("r2", "a", queue="q"), 1)
    with pytest.raises(InvalidArgumentError):
        sl.update_remote_weight(_rk("r1", "a"), 1)
    with pytest.raises(InvalidArgumentError):
        sl.add_remote_interest(key, weight=0)
    with pytest.raises(InvalidArgumentError):
        sl.add_remote_interest(_rk("r1", "b"), weight=2)


def test_remove_remote_interest() -> None:
    """Removing a key forgets it; removing an absent key is NotFoundError."""
    sl = SubList()
    key = _rk("r1", "a.*")
    sl.add_remote_interest(key)
    sl.remove_remote_interest(key)
    assert not sl.has_remote_interest("A", "a.b")
    with pytest.raises(NotFoundError):
        sl.remove_remote_interest(key)
    sl.check_invariants()
    assert (sl.stats().remote_interests, sl.stats().remote_routes) == (0, 0)


def test_remove_route_drops_all_of_its_interest_only() -> None:
    """A route going away drops its interest in every account; other routes keep theirs."""
    sl = SubList()
    sl.add_remote_interest(_rk("r1", "a.>"))
    sl.add_remote_interest(_rk("r1", "b", queue="q"), weight=2)
    sl.add_remote_interest(_rk("r1", "a.b", account="B"))
    sl.add_remote_interest(_rk("r2", "a.b"))
    assert sl.remove_route("r1") == 3
    assert sl.match_remote("A", "a.b").routes == ("r2",)
    assert not sl.has_remote_interest("A", "b")
    assert not sl.has_remote_interest("B", "a.b")
    assert sl.remove_route("r1") == 0
    assert (sl.stats().remote_interests, sl.stats().remote_routes) == (1, 1)
    sl.check_invariants()


def test_remote_changes_leave_the_local_cache_alone() -> None:
    """Remote interest is not part of match results, so changing it keeps cached entries."""
    sl = SubList()
    sl.insert(_sub("a"))
    sl.match("a")
    sl.add_remote_interest(_rk("r1", "a"))
    sl.remove_route("r1")
    sl.match("a")
    assert sl.stats().cache_hits == 1


def test_remote_key_validation() -> None:
    with pytest.raises(InvalidArgumentError):
        _rk("", "a")
    with pytest.raises(InvalidArgumentError):
        _rk("r", "a", account="")
    with pytest.raises(InvalidArgumentError):
        _rk("r", "a.>.b")
    with pytest.raises(InvalidArgumentError):
        SubList().has_remote_interest("A", "a.*")


# ---------------------------------------------------------------------------------------------
# Stats


def test_stats_count_operations_and_fanout() -> None:
    """Stats report subscriptions, inserts, removes, matches, hits, hit rate and fanout
    (average and maximum over every match served)."""
    sl = SubList()
    subs = [_sub("a.*", sid=1), _sub("a.b", sid=2), _sub("a.b", sid=3, queue="q"), _sub("c")]
    for s in subs:
        sl.insert(s)
    sl.remove(subs[-1])
    sl.match("a.b")  # fanout 3: two plain + one queue group
    sl.match("a.b")  # hit, fanout 3
    sl.match("a.x")  # fanout 1
    sl.match("zzz")  # fanout 0
    stats = sl.stats()
    assert stats.subscriptions == 3
    assert (stats.inserts, stats.removes, stats.matches, stats.cache_hits) == (4, 1, 4, 1)
    assert stats.cache_hit_rate == pytest.approx(0.25)
    assert stats.fanout_avg == pytest.approx((3 + 3 + 1 + 0) / 4)
    assert stats.fanout_max == 3
    assert stats.cache_entries == 3
    assert stats.generation == 5


def test_stats_of_an_unused_sublist_are_zero() -> None:
    stats = SubList().stats()
    assert (stats.matches, stats.cache_hit_rate, stats.fanout_avg, stats.nodes) == (0, 0.0, 0.0, 0)


# ---------------------------------------------------------------------------------------------
# Model-based: SubList against brute force

_TOKENS = ("a", "b", "c")
_SUBJECTS = st.lists(st.sampled_from(_TOKENS), min_size=1, max_size=4).map(".".join)


@st.composite
def _filters(draw: st.DrawFn) -> str:
    toks = draw(st.lists(st.sampled_from((*_TOKENS, "*")), min_size=0, max_size=3))
    if not toks or draw(st.booleans()):
        toks.append(">")
    return ".".join(toks)


_SUBS = st.builds(
    Subscription,
    subject=st.one_of(_filters(), _SUBJECTS),
    sid=st.integers(0, 2),
    queue=st.sampled_from((None, None, "q1", "q2")),
)
_REMOTE_KEYS = st.builds(
    RemoteKey,
    route=st.sampled_from(("r1", "r2", "r3")),
    account=st.sampled_from(("A", "B")),
    subject=st.one_of(_filters(), _SUBJECTS),
    queue=st.sampled_from((None, "q1")),
)


class SubListMachine(RuleBasedStateMachine):
    """Inserts, removes and matches (local and remote) against a plain set/dict model.

    A tiny cache (4 entries, swept to 2) makes hits, stale entries and sweeps all frequent.
    """

    live = Bundle("live")

    def __init__(self) -> None:
        super().__init__()
        self.sl = SubList(cache_entries_max=4, cache_sweep_entries=2)
        self.model: set[Subscription] = set()
        self.remote: dict[RemoteKey, int] = {}

    @rule(target=live, sub=_SUBS)
    def insert(self, sub: Subscription) -> Subscription:
        if sub in self.model:
            with pytest.raises(AlreadyExistsError):
                self.sl.insert(sub)
        else:
            self.sl.insert(sub)
            self.model.add(sub)
        return sub

    @rule(sub=consumes(live))
    def remove(self, sub: Subscription) -> None:
        if sub in self.model:
            self.sl.remove(sub)
            self.model.remove(sub)
        else:
            with pytest.raises(NotFoundError):
                self.sl.remove(sub)

    @rule(subject=_SUBJECTS)
    def match(self, subject: str) -> None:
        assert _as_sets(self.sl.match(subject)) == _expected(self.model, subject)

    @rule(key=_REMOTE_KEYS, weight=st.integers(1, 4))
    def add_remote(self, key: RemoteKey, weight: int) -> None:
        weight = 1 if key.queue is None else weight
        self.sl.add_remote_interest(key, weight)
        self.remote[key] = weight

    @precondition(lambda self: bool(self.remote))
    @rule(data=st.data())
    def remove_remote(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.remote, key=repr)))
        self.sl.remove_remote_interest(key)
        del self.remote[key]

    @rule(route=st.sampled_from(("r1", "r2", "r3")))
    def remove_route(self, route: str) -> None:
        gone = [k for k in self.remote if k.route == route]
        assert self.sl.remove_route(route) == len(gone)
        for k in gone:
            del self.remote[k]

    @rule(account=st.sampled_from(("A", "B")), subject=_SUBJECTS)
    def match_remote(self, account: str, subject: str) -> None:
        expected = _expected_remote(self.remote, account, subject)
        got = self.sl.match_remote(account, subject)
        assert _remote_as_plain(got) == _remote_as_plain(expected)
        assert self.sl.has_remote_interest(account, subject) is bool(expected.routes)

    @invariant()
    def consistent(self) -> None:
        self.sl.check_invariants()
        stats = self.sl.stats()
        assert stats.subscriptions == len(self.model)
        assert stats.remote_interests == len(self.remote)
        assert stats.cache_entries <= 4
        if not self.model:
            assert stats.nodes == 0


SubListMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestSubListModel = SubListMachine.TestCase


# ---------------------------------------------------------------------------------------------
# Threads


_THREADS = 4
_OPS_PER_THREAD = 3000
_THREAD_FILTERS = ("a", "a.b", "a.*", "a.>", "*.b", ">", "b.c", "*.*", "a.b.c", "b.>")
_THREAD_SUBJECTS = ("a", "a.b", "a.c", "b.b", "b.c", "a.b.c", "c")


def _worker(sl: SubList, index: int, barrier: threading.Barrier, errors: list[str]) -> None:
    """Run ``_steps`` and record any failure: an exception in a thread must fail the test."""
    try:
        _steps(sl, index, barrier, errors)
    except Exception as exc:
        errors.append(f"thread {index}: {exc!r}")


def _steps(sl: SubList, index: int, barrier: threading.Barrier, errors: list[str]) -> None:
    """Random inserts/removes/matches on this thread's own subscriptions (sid = index).

    After each step the thread matches a subject and checks that the result, restricted to
    its own subscriptions, is exactly what its own model says: no other thread touches them,
    so a stale cache entry or a torn trie update would show up as a difference.
    """
    rng = random.Random(index)
    mine: set[Subscription] = set()
    barrier.wait()
    for step in range(_OPS_PER_THREAD):
        sub = Subscription(
            subject=rng.choice(_THREAD_FILTERS), sid=index, queue=rng.choice((None, "q"))
        )
        if sub in mine:
            sl.remove(sub)
            mine.discard(sub)
        else:
            sl.insert(sub)
            mine.add(sub)
        subject = rng.choice(_THREAD_SUBJECTS)
        plain, queues = _as_sets(sl.match(subject))
        own = (
            {s for s in plain if s.sid == index},
            {q: ms for q, m in queues.items() if (ms := {s for s in m if s.sid == index})},
        )
        if own != _expected(mine, subject):
            errors.append(f"thread {index} step {step}: {subject!r} -> {own}")
            return


@pytest.mark.timeout(240)
def test_concurrent_insert_remove_match_agree_with_the_model() -> None:
    """Several threads mutate and match one SubList; every thread always reads its own
    writes, and the final state (subscriptions, matches, counters, pruning) equals the
    model built from what each thread did."""
    sl = SubList(cache_entries_max=8, cache_sweep_entries=4)
    barrier = threading.Barrier(_THREADS)
    errors: list[str] = []
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, to interleave critical sections
    try:
        threads = [
            threading.Thread(target=_worker, args=(sl, i, barrier, errors)) for i in range(_THREADS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old_interval)
    assert errors == []
    # Replay each thread's deterministic choices to build the final model independently.
    model: set[Subscription] = set()
    for index in range(_THREADS):
        model |= _replay(index)
    assert sl.subscriptions() == model
    for subject in (*_THREAD_SUBJECTS, "z"):
        assert _as_sets(sl.match(subject)) == _expected(model, subject)
    sl.check_invariants()
    stats = sl.stats()
    assert stats.inserts - stats.removes == len(model)
    assert stats.inserts + stats.removes == _THREADS * _OPS_PER_THREAD
    assert stats.matches == _THREADS * _OPS_PER_THREAD + 8


def _replay(index: int) -> set[Subscription]:
    """The subscriptions thread ``index`` held at the end (same seed, same choices)."""
    rng = random.Random(index)
    mine: set[Subscription] = set()
    for _ in range(_OPS_PER_THREAD):
        sub = Subscription(
            subject=rng.choice(_THREAD_FILTERS), sid=index, queue=rng.choice((None, "q"))
        )
        mine.symmetric_difference_update({sub})
        rng.choice(_THREAD_SUBJECTS)
    return mine
