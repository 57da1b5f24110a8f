"""The early-message stash: pieces that grow as bytes arrive, copied nowhere until the
message is delivered, their memory reused through the pool."""

from __future__ import annotations

import numpy as np
import pytest

from pycollective.transport.tcp.stash import (
    FIRST_PIECE,
    LARGEST_PIECE,
    POOL_BYTES,
    Stash,
    StashPool,
)


def _fill(stash: Stash, data: bytes) -> None:
    """Land `data` in the stash as the receive loop does: piece after piece."""
    at = 0
    view = stash.first
    while True:
        n = min(view.nbytes, len(data) - at)
        view[:n] = data[at : at + n]
        at += n
        if stash.before_last + view.nbytes >= stash.nbytes:
            return
        view = stash.grow()


def test_pieces_double_up_to_the_largest_and_the_last_is_cut_to_the_message() -> None:
    nbytes = 40 << 20
    stash = Stash(nbytes, StashPool())
    sizes = [stash.first.nbytes]
    while stash.before_last + sizes[-1] < nbytes:
        sizes.append(stash.grow().nbytes)
    assert sizes[:4] == [FIRST_PIECE, 2 * FIRST_PIECE, 4 * FIRST_PIECE, LARGEST_PIECE]
    assert max(sizes) == LARGEST_PIECE and sum(sizes) == nbytes


def test_an_announcement_alone_allocates_one_first_piece() -> None:
    stash = Stash(1 << 40, StashPool())
    assert stash.first.nbytes == stash.allocated == FIRST_PIECE


def test_a_small_message_takes_what_it_needs() -> None:
    stash = Stash(100, StashPool())
    assert stash.first.nbytes == 100 and stash.allocated == 100
    assert Stash(0, StashPool()).first.nbytes == 0


@pytest.mark.parametrize("nbytes", [1, 1000, FIRST_PIECE, FIRST_PIECE + 3, (11 << 20) + 12])
def test_what_lands_comes_back_in_order(nbytes: int) -> None:
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    stash = Stash(nbytes, StashPool())
    _fill(stash, data)
    assert bytes(stash) == data
    assert b"".join(bytes(p) for p in stash.parts()) == data
    out = bytearray(nbytes + 5)
    stash.copy_into(memoryview(out))
    assert bytes(out[:nbytes]) == data and out[nbytes:] == bytes(5)
    upto = nbytes // 2
    part = bytearray(upto)
    stash.copy_into(memoryview(part), upto)
    assert bytes(part) == data[:upto]
    assert sum(p.nbytes for p in stash.parts(upto)) == upto


def test_released_pieces_are_reused_and_the_pool_is_bounded() -> None:
    pool = StashPool()
    stash = Stash(3 * FIRST_PIECE, pool)
    first = stash.first
    second = stash.grow()
    stash.release()
    assert pool.kept == 3 * FIRST_PIECE
    again = Stash(3 * FIRST_PIECE, pool)
    assert again.first.obj is first.obj and again.grow().obj is second.obj
    assert pool.kept == 0
    for _ in range(2 * POOL_BYTES // LARGEST_PIECE):
        pool.give(np.empty(LARGEST_PIECE, dtype=np.uint8))
    assert pool.kept == POOL_BYTES
    small = Stash(10, pool)
    small.release()  # a bytearray of its own: nothing to keep
    assert pool.kept == POOL_BYTES
