"""Refuse a truncated LMDB data file before LMDB maps it.

LMDB memory-maps ``data.mdb`` and trusts its meta page's record of the pages in use. When
the file was cut short while the node was down (a full disk, a bad copy, the chaos
nemesis), the first touch of a page past the end of the file is a SIGBUS that kills the
process: no exception, no message. Opening the environment read-only or lock-free does not
help, since reads go through the same map. So the check here reads the two meta pages with
plain file reads (no mmap) and compares the file's size with what they record, raising
``DataLossError`` instead.

Layout read (LMDB 0.9.x, native byte order and alignment): each meta page is a page header
(``MDB_page``: pgno, pad, flags, lower/upper) followed by ``MDB_meta``: magic
``0xBEEFC0DE``, data version, map address, map size, two ``MDB_db`` records (the free DB,
whose ``md_pad`` holds the page size, and the main DB), the last page number in use and the
transaction id. Meta page 0 starts the file; meta page 1 starts one page in. The meta with
the higher transaction id is the current one.

Pure stdlib (``os``, ``struct``) so that both the engine and the Raft storage may import it.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from raftstream.errors import DataLossError

__all__ = ["DATA_FILE", "LmdbMeta", "check_lmdb_env", "read_meta", "required_size"]

DATA_FILE = "data.mdb"
LMDB_MAGIC = 0xBEEFC0DE
LMDB_DATA_VERSION = 1

# '@': native byte order and C alignment, as LMDB writes its structs. Fields, in order:
# MDB_page header: mp_pgno (size_t), mp_pad (u16), mp_flags (u16), lower/upper (2 x u16).
# MDB_meta: mm_magic (u32), mm_version (u32), mm_address (void *), mm_mapsize (size_t),
# mm_dbs[2] each md_pad (u32), md_flags (u16), md_depth (u16), branch/leaf/overflow pages,
# entries and root (5 x size_t); then mm_last_pg (size_t) and mm_txnid (size_t).
_DB = "IHHNNNNN"
_META = struct.Struct("@NHHI" + "IIPN" + _DB + _DB + "NN")
_MAGIC, _VERSION, _PSIZE, _LAST_PG, _TXNID = 4, 5, 8, -2, -1

# LMDB's page size is the OS page size, always a power of two in this range.
_PAGE_SIZE_MIN = 512
_PAGE_SIZE_MAX = 1 << 16


class LmdbMeta(NamedTuple):
    """The fields of one meta page that the size check needs."""

    page_size: int
    last_pg: int
    txnid: int


def _read_at(fh: int, offset: int, size: int) -> bytes:
    """Up to ``size`` bytes at ``offset``: fewer when the file ends first."""
    return os.pread(fh, size, offset)


def _parse_meta(raw: bytes, path: str, which: int) -> LmdbMeta:
    """Decode meta page ``which`` from its first bytes; ``DataLossError`` if not a meta."""
    if len(raw) < _META.size:
        raise DataLossError(f"{path}: truncated: meta page {which} is incomplete", path=path)
    fields = _META.unpack_from(raw)
    if fields[_MAGIC] != LMDB_MAGIC:
        raise DataLossError(f"{path}: not an LMDB file (bad magic in meta page {which})", path=path)
    if fields[_VERSION] != LMDB_DATA_VERSION:
        raise DataLossError(f"{path}: unsupported LMDB data version {fields[_VERSION]}", path=path)
    page_size = fields[_PSIZE]
    if not (_PAGE_SIZE_MIN <= page_size <= _PAGE_SIZE_MAX and page_size & (page_size - 1) == 0):
        raise DataLossError(
            f"{path}: meta page {which} records a bad page size {page_size}", path=path
        )
    return LmdbMeta(page_size=page_size, last_pg=fields[_LAST_PG], txnid=fields[_TXNID])


def read_meta(path: str | os.PathLike[str]) -> LmdbMeta:
    """The current meta (higher transaction id) of the LMDB data file at ``path``.

    Plain reads only: never mmap a file that may be truncated. Raises ``DataLossError`` when
    either meta page is missing or is not an LMDB meta page (LMDB itself refuses such a file).
    """
    name = os.fspath(path)
    fh = os.open(name, os.O_RDONLY)
    try:
        first = _parse_meta(_read_at(fh, 0, _META.size), name, 0)
        second = _parse_meta(_read_at(fh, first.page_size, _META.size), name, 1)
    finally:
        os.close(fh)
    return max(first, second, key=lambda m: m.txnid)


def required_size(meta: LmdbMeta) -> int:
    """The bytes the file must hold: every page up to and including ``last_pg``."""
    return (meta.last_pg + 1) * meta.page_size


def check_lmdb_env(directory: str | os.PathLike[str]) -> None:
    """Raise ``DataLossError`` unless the LMDB environment in ``directory`` is safe to map.

    Call before ``lmdb.open``. A missing data file is fine (a fresh environment); one shorter
    than its meta page's record of the pages in use would SIGBUS on first touch, so it is
    refused, naming the file, its size and the size required.
    """
    path = os.path.join(os.fspath(directory), DATA_FILE)
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return
    meta = read_meta(path)
    need = required_size(meta)
    if size < need:
        raise DataLossError(
            f"{path}: truncated LMDB data file: {size} bytes, but its meta page records "
            f"{meta.last_pg + 1} pages of {meta.page_size} bytes in use ({need} bytes)",
            path=path,
            size=size,
            required=need,
        )
