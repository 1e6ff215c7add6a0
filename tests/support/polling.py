"""Polling: the one way a test waits for something that has no awaitable of its own.

A probe is called every ``interval_s`` until it answers; ``None`` or ``False`` means "not
yet", any other value is the answer and is returned (so a count of 0 is an answer: probe
``n > 0``). Exceptions of the types in ``retrying`` also mean "not yet" (a node that is
still electing, an assert inside the probe); any other exception fails the wait at once.
After ``timeout_s`` the wait fails with ``NeverHappened``, whose message says what was
awaited and the last value (or error) seen; the last error is its ``__cause__``.

``until`` is for async code (the probe may return an awaitable, which is awaited);
``wait_for`` blocks a thread; ``retry_async`` awaits a call until it stops raising. All
three are one policy, on tenacity (``_policy``). The timeout is a safety net against a
hang, not a timed assertion: it is generous, and a test that checks a timing says so
itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryError, Retrying, stop_after_delay, wait_fixed

__all__ = [
    "INTERVAL_S",
    "TIMEOUT_S",
    "NeverHappened",
    "retry_async",
    "until",
    "wait_for",
]

T = TypeVar("T")

TIMEOUT_S = 60.0
INTERVAL_S = 0.01
RETRY_INTERVAL_S = 0.2  # between calls retried on an error (each is a round trip)


class NeverHappened(TimeoutError):
    """A wait timed out: what was awaited, and the last value or error seen."""


class _NotYet(Exception):
    """A probe's answer that means "not yet" (None or False), kept for the failure message."""

    def __init__(self, value: object) -> None:
        super().__init__(value)
        self.value = value


def _describe(probe: Callable[..., object]) -> str:
    """Where ``probe`` is defined (a lambda's name alone says nothing)."""
    code = getattr(probe, "__code__", None)
    name = getattr(probe, "__qualname__", repr(probe))
    if code is None:
        return name
    return f"{name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"


def _policy(
    timeout_s: float, interval_s: float, retrying: tuple[type[BaseException], ...]
) -> dict[str, Any]:
    return {
        "stop": stop_after_delay(timeout_s),
        "wait": wait_fixed(interval_s),
        "retry": lambda state: (
            state.outcome is not None
            and isinstance(state.outcome.exception(), (_NotYet, *retrying))
        ),
    }


def _answered(value: object) -> bool:
    return value is not None and value is not False


def _answer(value: T | None, accept: Callable[[Any], bool] | None) -> T:
    if not (accept or _answered)(value):
        raise _NotYet(value)
    return value  # type: ignore[return-value]


def _never(what: str, timeout_s: float, err: RetryError) -> NeverHappened:
    last = err.last_attempt.exception()
    seen = f"last seen: {last.value!r}" if isinstance(last, _NotYet) else f"last error: {last!r}"
    failure = NeverHappened(f"never happened within {timeout_s:g}s: {what} ({seen})")
    if last is not None and not isinstance(last, _NotYet):
        failure.__cause__ = last
    return failure


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout_s: float = TIMEOUT_S,
    *,
    interval_s: float = 0.05,
    retrying: tuple[type[BaseException], ...] = (),
    accept: Callable[[Any], bool] | None = None,
) -> T:
    """Call ``probe`` (blocking this thread between calls) until it answers; return that.
    ``accept`` as for ``until``."""
    try:
        for attempt in Retrying(**_policy(timeout_s, interval_s, retrying)):
            with attempt:
                value = _answer(probe(), accept)
    except RetryError as err:
        failure = _never(what, timeout_s, err)
        raise failure from failure.__cause__
    return value


async def until(
    probe: Callable[[], T | Awaitable[T | None] | None],
    *,
    what: str | None = None,
    timeout_s: float = TIMEOUT_S,
    interval_s: float = INTERVAL_S,
    retrying: tuple[type[BaseException], ...] = (),
    accept: Callable[[Any], bool] | None = None,
) -> T:
    """Call ``probe`` (awaiting its answer when it returns an awaitable) until it answers;
    return that. ``what`` defaults to where the probe is defined. ``accept``: which values
    are an answer, instead of all but None and False (the last value refused is shown when
    the wait fails: probe the thing, accept what it must become)."""
    try:
        async for attempt in AsyncRetrying(**_policy(timeout_s, interval_s, retrying)):
            with attempt:
                got = probe()
                if inspect.isawaitable(got):
                    got = await got
                value = _answer(got, accept)
    except RetryError as err:
        failure = _never(what or _describe(probe), timeout_s, err)
        raise failure from failure.__cause__
    return value  # type: ignore[return-value]


async def retry_async(
    fn: Callable[[], Awaitable[T]], *, timeout_s: float = TIMEOUT_S, what: str | None = None
) -> T:
    """Await ``fn()`` until it does not raise; return its result (whatever it is)."""
    return await until(
        fn,
        what=what,
        timeout_s=timeout_s,
        interval_s=RETRY_INTERVAL_S,
        retrying=(Exception,),
        accept=lambda _: True,
    )
