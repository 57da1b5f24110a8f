"""Where a message that came before its receive is kept until it is asked for.

A message under 1 MiB lands in one bytearray of its size. A larger one lands in pieces
that grow as its bytes arrive (1 MiB, then twice the last, up to 8 MiB), so a peer's
announcement alone allocates little (a length a peer sends is never trusted with memory)
and growing copies nothing: a stash that doubled one array copied about half of every
large early message once more, and page-faulted fresh memory for it, on each call of a
two-rank ring (its second half is sent while the peer still reduces the first). Pieces
of the standard sizes go back to the transport's pool when their message is delivered,
so the next early message reuses memory already mapped.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

FIRST_PIECE = 1 << 20  # a multiple of every item size: pieces never split an item
LARGEST_PIECE = 8 << 20
POOL_BYTES = 64 << 20  # pieces kept for reuse, at most


class StashPool:
    """Freed pieces of the standard sizes, kept (up to POOL_BYTES) for the next stash."""

    __slots__ = ("_free", "_bytes")

    def __init__(self) -> None:
        self._free: dict[int, list[np.ndarray]] = {}
        self._bytes = 0

    def take(self, size: int) -> np.ndarray:
        free = self._free.get(size)
        if free:
            self._bytes -= size
            return free.pop()
        return np.empty(size, dtype=np.uint8)

    def give(self, piece: np.ndarray) -> None:
        if self._bytes + piece.size <= POOL_BYTES:
            self._free.setdefault(piece.size, []).append(piece)
            self._bytes += piece.size

    @property
    def kept(self) -> int:
        """Bytes of pieces kept for reuse."""
        return self._bytes

    def clear(self) -> None:
        self._free.clear()
        self._bytes = 0


class Stash:
    """One early message's bytes, in the order they came. `nbytes` is the message's size;
    `first` is where its first bytes go, and `grow` gives the piece the next bytes go to
    once the last one is full."""

    __slots__ = ("nbytes", "before_last", "first", "_pieces", "_views", "_pool")

    def __init__(self, nbytes: int, pool: StashPool) -> None:
        self.nbytes = nbytes
        self.before_last = 0  # bytes in the pieces before the last
        self._pool = pool
        self._pieces: list[np.ndarray] | None
        self._views: list[memoryview] | None
        if nbytes < FIRST_PIECE:  # the common case, kept as cheap as one bytearray
            self.first = memoryview(bytearray(nbytes))
            self._pieces = self._views = None
        else:
            piece = pool.take(FIRST_PIECE)
            self.first = memoryview(piece)
            self._pieces = [piece]
            self._views = [self.first]

    def grow(self) -> memoryview:
        """One more piece, after the last one filled up with more to come."""
        pieces, views = self._pieces, self._views
        assert pieces is not None and views is not None  # noqa: S101 - a large message
        self.before_last += views[-1].nbytes
        size = min(2 * pieces[-1].size, LARGEST_PIECE)
        piece = self._pool.take(size)
        pieces.append(piece)
        view = memoryview(piece)[: min(size, self.nbytes - self.before_last)]
        views.append(view)
        return view

    @property
    def allocated(self) -> int:
        """Bytes of memory its pieces take."""
        if self._pieces is None:
            return self.first.nbytes
        return sum(p.size for p in self._pieces)

    def parts(self, upto: int | None = None) -> Iterator[memoryview]:
        """Its first `upto` bytes (all of them by default), piece by piece."""
        left = self.nbytes if upto is None else upto
        for view in self._views or (self.first,):
            if left <= 0:
                return
            yield view[:left] if left < view.nbytes else view
            left -= view.nbytes

    def copy_into(self, dest: memoryview, upto: int | None = None) -> None:
        """Copy its first `upto` bytes to the start of `dest` (a byte view)."""
        if self._views is None:
            n = self.nbytes if upto is None else upto
            dest[:n] = self.first[:n]
            return
        at = 0
        for part in self.parts(upto):
            dest[at : at + part.nbytes] = part
            at += part.nbytes

    def __bytes__(self) -> bytes:
        if self._views is None:
            return bytes(self.first)
        return b"".join(bytes(part) for part in self.parts())

    def release(self) -> None:
        """Give its pieces back to the pool: nothing reads them any more."""
        if self._pieces is not None:
            for piece in self._pieces:
                self._pool.give(piece)
            self._pieces = self._views = None
