"""SubList: the subject routing trie with a match cache and remote-interest bookkeeping.

Publishes are routed, and consumer filters resolved, by asking a SubList which subscriptions
match a literal subject. The trie has one level per token; each level has literal edges
keyed by token plus at most one ``*`` edge and one ``>`` edge. Subscriptions hang off the node
where their subject ends: plain ones in a set, queue-group ones grouped by queue name.

Match results are cached per literal subject. Instead of walking the cache on every change,
each cache entry is stamped with the generation it was computed at and every change to the
local trie bumps the generation, so a stale entry is simply ignored (and refreshed) when it is
next looked up. The cache holds at most ``cache_entries_max`` entries; when a miss pushes it
over, it is swept back down (stale entries first, then the oldest-inserted ones; not LRU).

Remote interest (what other routes/nodes subscribe to) is kept apart from local
subscriptions, per account, in its own tries, keyed by (route, account, subject, queue) with a
weight for queue interest (how many members the remote queue group has).

Thread safety: one ``threading.Lock`` guards everything. Every public method takes it; a
cache hit holds it only for a dictionary lookup and a few counter updates (no tokenizing, no
allocation), a miss holds it while walking the trie. Results are immutable and shared between
callers (the cache hands the same object to everyone); never mutate them.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Generic, TypeVar

from raftstream.engine.subjects import (
    FWC,
    PWC,
    tokenize,
    validate_filter,
    validate_queue,
    validate_subject,
)
from raftstream.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, invariant

__all__ = [
    "CACHE_ENTRIES_MAX",
    "CACHE_SWEEP_ENTRIES",
    "RemoteKey",
    "RemoteMatch",
    "SubList",
    "SubListResult",
    "SubListStats",
    "Subscription",
]

# The defaults JetStream's sublist uses: big enough for a hot working set of subjects, small
# enough that a flood of distinct subjects cannot grow memory without bound.
CACHE_ENTRIES_MAX = 1024
# How far below the bound a sweep goes, so that sweeps are rare (amortized O(1) per miss).
CACHE_SWEEP_ENTRIES = 256

_T = TypeVar("_T", bound=Hashable)


# --------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True, slots=True)
class Subscription:
    """A local subscription: a subject filter, an optional queue group and an opaque ``sid``.

    ``sid`` identifies the owner (a consumer, a client connection...) and must be hashable;
    two subscriptions are the same when subject, sid and queue are all equal. The subject and
    queue are validated on construction, so a Subscription value is always well formed.
    """

    subject: str
    sid: Hashable
    queue: str | None = None

    def __post_init__(self) -> None:
        validate_filter(self.subject, "subject")
        if self.queue is not None:
            validate_queue(self.queue, "queue")


@dataclass(frozen=True, slots=True)
class SubListResult:
    """What matched a literal subject.

    ``plain`` holds the plain subscriptions (each gets a copy of the message); ``queues``
    maps each queue name to its matching members (one member per group gets the message).
    Immutable and shared: the cache returns the same object to every caller.
    """

    plain: tuple[Subscription, ...]
    queues: Mapping[str, tuple[Subscription, ...]]

    @property
    def fanout(self) -> int:
        """Deliveries one message would cause: one per plain sub, one per queue group."""
        return len(self.plain) + len(self.queues)

    def __len__(self) -> int:
        """Number of matching subscriptions (plain and queue members)."""
        return len(self.plain) + sum(len(m) for m in self.queues.values())


@dataclass(frozen=True, slots=True)
class RemoteKey:
    """Identity of one piece of remote interest: a route's subscription in an account.

    ``queue`` is None for plain interest. Validated on construction.
    """

    route: str
    account: str
    subject: str
    queue: str | None = None

    def __post_init__(self) -> None:
        for field, value in (("route", self.route), ("account", self.account)):
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError(field, "must be a non-empty string")
        validate_filter(self.subject, "subject")
        if self.queue is not None:
            validate_queue(self.queue, "queue")


@dataclass(frozen=True, slots=True)
class RemoteMatch:
    """Which routes want a message published in an account on a literal subject.

    ``plain_routes``: routes with plain interest (each gets one copy). ``queue_weights``: for
    each queue name, each route's weight (the summed weights of its matching queue interest),
    to pick a member group across routes in proportion. ``routes`` is every route named in
    either. All sorted by route name, so the answer does not depend on insertion order.
    """

    plain_routes: tuple[str, ...]
    queue_weights: Mapping[str, Mapping[str, int]]

    @property
    def routes(self) -> tuple[str, ...]:
        queued = {r for weights in self.queue_weights.values() for r in weights}
        return tuple(sorted(queued.union(self.plain_routes)))


@dataclass(frozen=True, slots=True)
class SubListStats:
    """A consistent snapshot of a SubList's counters (taken under its lock).

    ``nodes`` counts local trie nodes (zero when no subscription is left: pruning works);
    fanout figures are over every match served, hits included.
    """

    subscriptions: int
    nodes: int
    cache_entries: int
    generation: int
    inserts: int
    removes: int
    matches: int
    cache_hits: int
    cache_hit_rate: float
    fanout_avg: float
    fanout_max: int
    remote_interests: int
    remote_routes: int


_EMPTY_RESULT = SubListResult(plain=(), queues=MappingProxyType({}))


# --------------------------------------------------------------------------------------------
# The trie (internal; not thread-safe on its own: the SubList's lock guards it)


class _Node(Generic[_T]):
    """Where a subject ends (if it holds items) and/or the way to the next token's level."""

    __slots__ = ("next", "plain", "queues")

    def __init__(self) -> None:
        self.next: _Level[_T] | None = None
        # dicts rather than sets: insertion-ordered, so results come out in a stable order.
        self.plain: dict[_T, None] = {}
        self.queues: dict[str, dict[_T, None]] = {}

    def is_empty(self) -> bool:
        return not self.plain and not self.queues and self.next is None


class _Level(Generic[_T]):
    """The edges out of one token position: literal tokens, ``*`` and ``>``."""

    __slots__ = ("fwc", "literals", "pwc")

    def __init__(self) -> None:
        self.literals: dict[str, _Node[_T]] = {}
        self.pwc: _Node[_T] | None = None
        self.fwc: _Node[_T] | None = None

    def child(self, token: str) -> _Node[_T] | None:
        if token == PWC:
            return self.pwc
        if token == FWC:
            return self.fwc
        return self.literals.get(token)

    def set_child(self, token: str, node: _Node[_T]) -> None:
        if token == PWC:
            self.pwc = node
        elif token == FWC:
            self.fwc = node
        else:
            self.literals[token] = node

    def drop_child(self, token: str) -> None:
        if token == PWC:
            self.pwc = None
        elif token == FWC:
            self.fwc = None
        else:
            del self.literals[token]

    def is_empty(self) -> bool:
        return not self.literals and self.pwc is None and self.fwc is None

    def children(self) -> Iterator[_Node[_T]]:
        yield from self.literals.values()
        if self.pwc is not None:
            yield self.pwc
        if self.fwc is not None:
            yield self.fwc


class _Trie(Generic[_T]):
    """Items filed under tokenized subject filters; answers which items match a literal.

    Invariant (kept by ``remove``'s pruning, checked by ``check``): every node holds items or
    leads to a non-empty level, so an emptied trie has no nodes at all.
    """

    __slots__ = ("nodes", "root")

    def __init__(self) -> None:
        self.root: _Level[_T] = _Level()
        self.nodes = 0

    def insert(self, tokens: tuple[str, ...], queue: str | None, item: _T) -> None:
        """File ``item`` under ``tokens``; the caller guarantees it is not there yet."""
        node = self._node_for(tokens)
        bucket = node.plain if queue is None else node.queues.setdefault(queue, {})
        invariant(item not in bucket, f"trie already holds {item!r}")
        bucket[item] = None

    def _node_for(self, tokens: tuple[str, ...]) -> _Node[_T]:
        """The terminal node for ``tokens``, creating the path as needed."""
        node = self._child_or_new(self.root, tokens[0])
        for tok in tokens[1:]:
            if node.next is None:
                node.next = _Level()
            node = self._child_or_new(node.next, tok)
        return node

    def _child_or_new(self, level: _Level[_T], token: str) -> _Node[_T]:
        node = level.child(token)
        if node is None:
            node = _Node()
            level.set_child(token, node)
            self.nodes += 1
        return node

    def remove(self, tokens: tuple[str, ...], queue: str | None, item: _T) -> bool:
        """Unfile ``item``; prune nodes left empty. False when it was not there."""
        path: list[tuple[_Level[_T], str, _Node[_T]]] = []
        level: _Level[_T] | None = self.root
        for tok in tokens:
            node = level.child(tok) if level is not None else None
            if level is None or node is None:
                return False
            path.append((level, tok, node))
            level = node.next
        terminal = path[-1][2]
        if not _discard(terminal, queue, item):
            return False
        self._prune(path)
        return True

    def _prune(self, path: list[tuple[_Level[_T], str, _Node[_T]]]) -> None:
        """Walk back up from the terminal node, dropping nodes and levels that are empty."""
        for level, tok, node in reversed(path):
            if node.next is not None and node.next.is_empty():
                node.next = None
            if not node.is_empty():
                return
            level.drop_child(tok)
            self.nodes -= 1

    def match(self, tokens: tuple[str, ...]) -> tuple[list[_T], dict[str, list[_T]]]:
        """Items whose filter matches the literal ``tokens``: (plain, queue -> members)."""
        plain: list[_T] = []
        queues: dict[str, list[_T]] = {}
        _match_all(self.root, tokens, plain, queues)
        return plain, queues

    def check(self) -> int:
        """Verify the pruning invariant and the node counter; return the number of items."""
        nodes, items = _check_level(self.root)
        invariant(nodes == self.nodes, f"node counter {self.nodes} != {nodes} nodes in trie")
        return items


def _discard(node: _Node[_T], queue: str | None, item: _T) -> bool:
    """Remove ``item`` from its bucket at ``node``; drop the queue bucket when emptied."""
    bucket = node.plain if queue is None else node.queues.get(queue)
    if bucket is None or item not in bucket:
        return False
    del bucket[item]
    if queue is not None and not bucket:
        del node.queues[queue]
    return True


def _collect(node: _Node[_T], plain: list[_T], queues: dict[str, list[_T]]) -> None:
    plain.extend(node.plain)
    for name, members in node.queues.items():
        queues.setdefault(name, []).extend(members)


def _match_all(
    root: _Level[_T], tokens: tuple[str, ...], plain: list[_T], queues: dict[str, list[_T]]
) -> None:
    """Collect every item whose filter matches the literal ``tokens``.

    Each literal path is walked iteratively; a ``*`` edge forks a new walk, kept on an
    explicit stack rather than by recursion, because a valid filter may hold ~2000 ``*``
    tokens and Python's recursion limit is 1000.
    """
    stack: list[tuple[_Level[_T], int]] = [(root, 0)]
    while stack:
        level, start = stack.pop()
        _match_path(level, tokens, start, plain, queues, stack)


def _match_path(
    level: _Level[_T] | None,
    tokens: tuple[str, ...],
    start: int,
    plain: list[_T],
    queues: dict[str, list[_T]],
    forks: list[tuple[_Level[_T], int]],
) -> None:
    """Walk literal edges for ``tokens[start:]`` from ``level``, collecting ``>`` nodes on
    the way (they match whatever remains, at least one token) and pushing ``*`` forks."""
    node: _Node[_T] | None = None
    pwc: _Node[_T] | None = None
    last = len(tokens) - 1
    for i in range(start, len(tokens)):
        if level is None:
            return
        if level.fwc is not None:
            _collect(level.fwc, plain, queues)
        pwc = level.pwc
        if pwc is not None and i < last and pwc.next is not None:
            forks.append((pwc.next, i + 1))
        node = level.literals.get(tokens[i])
        level = node.next if node is not None else None
    # Only reached when every token was consumed: the last level's literal and '*' nodes end
    # exactly here.
    if node is not None:
        _collect(node, plain, queues)
    if pwc is not None:
        _collect(pwc, plain, queues)


def _check_level(root: _Level[_T]) -> tuple[int, int]:
    """(nodes, items) in the trie, raising InvariantError on an unpruned node or level.

    Iterative for the same reason as ``_match_all``: tries may be thousands of levels deep.
    """
    nodes = items = 0
    stack = [root]
    while stack:
        level = stack.pop()
        invariant(level is root or not level.is_empty(), "an empty level was left in the trie")
        for node in level.children():
            invariant(not node.is_empty(), "an empty node was left in the trie")
            invariant(all(node.queues.values()), "an empty queue group was left in the trie")
            nodes += 1
            items += len(node.plain) + sum(len(m) for m in node.queues.values())
            if node.next is not None:
                stack.append(node.next)
    return nodes, items


# --------------------------------------------------------------------------------------------
# The SubList


@dataclass(frozen=True, slots=True)
class _CacheEntry:
    result: SubListResult
    generation: int


class SubList:
    """Local subscriptions, their match cache and remote interest. Thread-safe (see module).

    Every public method takes the instance's single lock for its whole duration.
    """

    def __init__(
        self,
        *,
        cache_entries_max: int = CACHE_ENTRIES_MAX,
        cache_sweep_entries: int = CACHE_SWEEP_ENTRIES,
    ) -> None:
        """``cache_entries_max`` = 0 disables the cache; a sweep leaves at most
        ``cache_entries_max - cache_sweep_entries`` entries (at least 0)."""
        if cache_entries_max < 0:
            raise InvalidArgumentError("cache_entries_max", "must be >= 0")
        if cache_sweep_entries <= 0 or 0 < cache_entries_max < cache_sweep_entries:
            raise InvalidArgumentError(
                "cache_sweep_entries", "must be > 0 and at most cache_entries_max"
            )
        self._cache_entries_max = cache_entries_max
        self._cache_sweep_target = max(0, cache_entries_max - cache_sweep_entries)
        self._lock = threading.Lock()
        self._trie: _Trie[Subscription] = _Trie()
        self._subs: set[Subscription] = set()
        self._cache: dict[str, _CacheEntry] = {}
        self._generation = 0
        self._remote = _RemoteInterest()
        self._inserts = self._removes = self._matches = self._cache_hits = 0
        self._fanout_total = self._fanout_max = 0

    # -- local subscriptions ------------------------------------------------------------------

    def insert(self, sub: Subscription) -> None:
        """Add ``sub``; AlreadyExistsError if an equal subscription is present. Takes the lock."""
        with self._lock:
            if sub in self._subs:
                raise AlreadyExistsError(f"subscription already present: {sub!r}")
            self._trie.insert(tokenize(sub.subject), sub.queue, sub)
            self._subs.add(sub)
            self._inserts += 1
            # Cached results may now miss ``sub``: a new generation makes them all stale.
            self._generation += 1

    def remove(self, sub: Subscription) -> None:
        """Remove ``sub`` and prune emptied nodes; NotFoundError if absent. Takes the lock."""
        with self._lock:
            if sub not in self._subs:
                raise NotFoundError(f"no such subscription: {sub!r}")
            removed = self._trie.remove(tokenize(sub.subject), sub.queue, sub)
            invariant(removed, f"subscription {sub!r} was registered but not in the trie")
            self._subs.discard(sub)
            self._removes += 1
            self._generation += 1

    def match(self, subject: str) -> SubListResult:
        """Subscriptions matching the literal ``subject``. Takes the lock.

        On a cache hit (entry stamped with the current generation) the lock is held only for
        the lookup. On a miss the subject is validated (InvalidArgumentError for a filter or a
        malformed subject, and nothing is counted), the trie is walked and the result cached.
        The result is shared and immutable.
        """
        with self._lock:
            entry = self._cache.get(subject)
            if entry is not None and entry.generation == self._generation:
                self._cache_hits += 1
                result = entry.result
            else:
                result = self._match_miss(subject)
            self._matches += 1
            fanout = result.fanout
            self._fanout_total += fanout
            if fanout > self._fanout_max:
                self._fanout_max = fanout
            return result

    def _match_miss(self, subject: str) -> SubListResult:
        """Walk the trie and cache the result. Caller holds the lock."""
        validate_subject(subject, "subject")
        plain, queues = self._trie.match(tokenize(subject))
        if plain or queues:
            frozen = {name: tuple(members) for name, members in queues.items()}
            result = SubListResult(plain=tuple(plain), queues=MappingProxyType(frozen))
        else:
            result = _EMPTY_RESULT
        if self._cache_entries_max > 0:
            self._cache[subject] = _CacheEntry(result, self._generation)
            if len(self._cache) > self._cache_entries_max:
                self._sweep_cache()
        return result

    def _sweep_cache(self) -> None:
        """Bring the cache down to the sweep target. Caller holds the lock.

        Stale entries go first (they are useless); then the oldest-inserted ones, which the
        dict's insertion order gives for free. Not LRU, on purpose: a hit stays lock-cheap
        because it never reorders anything.
        """
        stale = [s for s, e in self._cache.items() if e.generation != self._generation]
        for s in stale:
            del self._cache[s]
        excess = len(self._cache) - self._cache_sweep_target
        if excess > 0:
            for s in list(itertools.islice(self._cache, excess)):
                del self._cache[s]
        invariant(len(self._cache) <= self._cache_entries_max, "cache sweep left it over bound")

    # -- remote interest ----------------------------------------------------------------------

    def add_remote_interest(self, key: RemoteKey, weight: int = 1) -> None:
        """Record (or re-weight) remote interest. Takes the lock.

        ``weight`` is the size of the remote queue group (>= 1); plain interest has weight 1.
        Adding a key that is present replaces its weight. Remote interest is not part of
        ``match`` results, so the match cache is left alone.
        """
        _check_weight(key, weight)
        with self._lock:
            self._remote.add(key, weight)

    def update_remote_weight(self, key: RemoteKey, weight: int) -> None:
        """Change the weight of present remote queue interest; NotFoundError if absent."""
        _check_weight(key, weight)
        if key.queue is None:
            raise InvalidArgumentError("queue", "only queue interest has a weight")
        with self._lock:
            if not self._remote.contains(key):
                raise NotFoundError(f"no such remote interest: {key!r}")
            self._remote.add(key, weight)

    def remove_remote_interest(self, key: RemoteKey) -> None:
        """Forget one piece of remote interest; NotFoundError if absent. Takes the lock."""
        with self._lock:
            if not self._remote.remove(key):
                raise NotFoundError(f"no such remote interest: {key!r}")

    def remove_route(self, route: str) -> int:
        """Forget all interest of ``route`` (it went away); returns how many keys went."""
        with self._lock:
            return self._remote.remove_route(route)

    def has_remote_interest(self, account: str, subject: str) -> bool:
        """True when some route's interest in ``account`` matches literal ``subject``."""
        validate_subject(subject, "subject")
        with self._lock:
            return bool(self._remote.match(account, subject))

    def match_remote(self, account: str, subject: str) -> RemoteMatch:
        """Routes (and their queue weights) interested in literal ``subject`` in ``account``."""
        validate_subject(subject, "subject")
        with self._lock:
            keys = self._remote.match(account, subject)
            weights = {k: self._remote.weight(k) for k in keys}
        return _remote_match(weights)

    # -- introspection ------------------------------------------------------------------------

    def stats(self) -> SubListStats:
        """A consistent snapshot of the counters. Takes the lock."""
        with self._lock:
            matches = self._matches
            return SubListStats(
                subscriptions=len(self._subs),
                nodes=self._trie.nodes,
                cache_entries=len(self._cache),
                generation=self._generation,
                inserts=self._inserts,
                removes=self._removes,
                matches=matches,
                cache_hits=self._cache_hits,
                cache_hit_rate=self._cache_hits / matches if matches else 0.0,
                fanout_avg=self._fanout_total / matches if matches else 0.0,
                fanout_max=self._fanout_max,
                remote_interests=len(self._remote),
                remote_routes=self._remote.route_count(),
            )

    def subscriptions(self) -> frozenset[Subscription]:
        """A snapshot of every live local subscription (the caller owns it). Takes the lock."""
        with self._lock:
            return frozenset(self._subs)

    def check_invariants(self) -> None:
        """Walk every trie and raise InvariantError if pruning or a counter is off.

        For tests and debugging: cost is linear in the size of the SubList. Takes the lock.
        """
        with self._lock:
            items = self._trie.check()
            invariant(items == len(self._subs), f"trie holds {items}, {len(self._subs)} known")
            invariant(len(self._cache) <= self._cache_entries_max, "cache over its bound")
            self._remote.check()


# --------------------------------------------------------------------------------------------
# Remote interest (internal; guarded by the SubList's lock)


class _RemoteInterest:
    """Remote keys filed per account in tries, their weights, and an index by route."""

    __slots__ = ("_by_account", "_by_route", "_weights")

    def __init__(self) -> None:
        self._weights: dict[RemoteKey, int] = {}
        self._by_account: dict[str, _Trie[RemoteKey]] = {}
        self._by_route: dict[str, set[RemoteKey]] = {}

    def __len__(self) -> int:
        return len(self._weights)

    def route_count(self) -> int:
        return len(self._by_route)

    def contains(self, key: RemoteKey) -> bool:
        return key in self._weights

    def weight(self, key: RemoteKey) -> int:
        return self._weights[key]

    def add(self, key: RemoteKey, weight: int) -> None:
        if key not in self._weights:
            trie = self._by_account.setdefault(key.account, _Trie())
            # Keys are filed as plain items: grouping by queue happens in _remote_match.
            trie.insert(tokenize(key.subject), None, key)
            self._by_route.setdefault(key.route, set()).add(key)
        self._weights[key] = weight

    def remove(self, key: RemoteKey) -> bool:
        if self._weights.pop(key, None) is None:
            return False
        trie = self._by_account[key.account]
        invariant(trie.remove(tokenize(key.subject), None, key), f"{key!r} not in its trie")
        if trie.nodes == 0:
            del self._by_account[key.account]
        keys = self._by_route[key.route]
        keys.discard(key)
        if not keys:
            del self._by_route[key.route]
        return True

    def remove_route(self, route: str) -> int:
        keys = list(self._by_route.get(route, ()))
        for key in keys:
            self.remove(key)
        return len(keys)

    def match(self, account: str, subject: str) -> list[RemoteKey]:
        trie = self._by_account.get(account)
        if trie is None:
            return []
        plain, _ = trie.match(tokenize(subject))
        return plain

    def check(self) -> None:
        # An account whose last interest went must not keep an empty trie around (a leak).
        invariant(all(t.nodes for t in self._by_account.values()), "empty account trie kept")
        filed = sum(trie.check() for trie in self._by_account.values())
        invariant(filed == len(self._weights), f"{filed} remote keys filed, {len(self)} known")
        indexed = sum(len(keys) for keys in self._by_route.values())
        invariant(indexed == len(self._weights), "route index out of step with remote keys")


def _check_weight(key: RemoteKey, weight: int) -> None:
    if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
        raise InvalidArgumentError("weight", "must be an integer >= 1")
    if key.queue is None and weight != 1:
        raise InvalidArgumentError("weight", "plain (non-queue) interest has weight 1")


def _remote_match(weights: Mapping[RemoteKey, int]) -> RemoteMatch:
    """Fold matching keys into per-route answers: plain routes, and queue -> route -> sum."""
    plain: set[str] = set()
    queues: dict[str, dict[str, int]] = {}
    for key, weight in weights.items():
        if key.queue is None:
            plain.add(key.route)
        else:
            per_route = queues.setdefault(key.queue, {})
            per_route[key.route] = per_route.get(key.route, 0) + weight
    frozen = {
        q: MappingProxyType(dict(sorted(per_route.items())))
        for q, per_route in sorted(queues.items())
    }
    return RemoteMatch(plain_routes=tuple(sorted(plain)), queue_weights=MappingProxyType(frozen))
