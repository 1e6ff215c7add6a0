"""The seam the ``Client``'s parts share: one retried call, and the paged listing.

``ClientCore`` holds no state of its own: ``raftstream.client.Client`` sets the attributes
it declares. The parts of the client's API (``_client_streams``, ``_client_consumers``,
``_client_cluster``) derive from it and reach the cluster only through ``_call`` (the
``Router``'s retrying call, within the caller's timeout) and ``_paged``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from raftstream import errors
from raftstream._conn import Router, Stubs
from raftstream.proto import raftstream_pb2 as pb

__all__ = ["LIST_PAGES_MAX", "ClientCore"]

T = TypeVar("T")

# A paged listing stops after this many pages even if the server keeps announcing more.
LIST_PAGES_MAX = 10_000


class ClientCore:
    """What every part of the client uses: the router, the default timeout and whether the
    client is closed (set by ``Client.__init__`` and ``Client.close``)."""

    _router: Router
    _timeout_s: float
    _closed: bool

    async def _call(
        self,
        route: str | None,
        invoke: Callable[[Stubs, float], Awaitable[T]],
        *,
        timeout: float | None,
        idempotent: bool,
    ) -> T:
        if self._closed:
            raise errors.ClientClosedError("the client is closed")
        timeout_s = timeout if timeout is not None else self._timeout_s
        return await self._router.call(route, invoke, timeout_s=timeout_s, idempotent=idempotent)

    async def _paged(
        self,
        page: Callable[[Stubs, float, int], Awaitable[tuple[list[Any], pb.Page]]],
        *,
        timeout: float | None,
    ) -> list[Any]:
        """Collect every page (each page one retried call, all within one timeout)."""
        out: list[Any] = []
        for _ in range(LIST_PAGES_MAX):
            offset = len(out)

            async def invoke(
                stubs: Stubs, left_s: float, offset: int = offset
            ) -> tuple[list[Any], pb.Page]:
                return await page(stubs, left_s, offset)

            items, info = await self._call(None, invoke, timeout=timeout, idempotent=True)
            out.extend(items)
            if not items or len(out) >= info.total:
                return out
        raise errors.LimitError(f"listing exceeded {LIST_PAGES_MAX} pages")

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ClientClosedError("the client is closed")
