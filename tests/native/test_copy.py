"""csrc/copy.c: the compiled copy that sidesteps memcpy's slow skewed case gives
memoryview's bytes at every size around its thresholds and every skew of the two
regions, overlapping ones as memmove, and refuses what it cannot copy."""

from __future__ import annotations

import numpy as np
import pytest

_native = pytest.importorskip("pycollective._native")

SIZES = [0, 1, 63, 64, 65, 2047, 2048, 2049, 4096 + 13, (64 << 10) + 5, 300_001]


@pytest.mark.parametrize("size", SIZES)
def test_every_skew_gives_memoryviews_bytes(size: int) -> None:
    rng = np.random.default_rng(size)
    pool = np.zeros(2 * size + 4096, np.uint8)
    base = (-pool.ctypes.data) % 64  # the pool's first 64-byte line
    src_all = rng.integers(0, 256, size + 128, dtype=np.uint8)
    for src_off in (0, 16, 44):
        src = memoryview(src_all)[src_off : src_off + size]
        for dst_off in range(64):
            pool[:] = 0xA5
            lo = base + size + 128 + dst_off  # clear of nothing else: guards around it
            _native.copy(memoryview(pool)[lo : lo + size], src)
            assert bytes(pool[lo : lo + size]) == bytes(src), (src_off, dst_off)
            assert not (pool[:lo] != 0xA5).any() and not (pool[lo + size :] != 0xA5).any()


@pytest.mark.parametrize("shift", [-20, -1, 1, 20, 100])
def test_overlapping_regions_copy_as_memoryview_does(shift: int) -> None:
    """As memmove: the arena's copy() moved in place with memmove before, and a caller
    may still pass an input that overlaps its output."""
    data = np.random.default_rng(abs(shift)).integers(0, 256, 8192, dtype=np.uint8)
    ours, want = bytearray(data.tobytes()), bytearray(data.tobytes())
    lo = 200
    mv = memoryview(want)
    mv[lo + shift : lo + shift + 4000] = mv[lo : lo + 4000]
    _native.copy(memoryview(ours)[lo + shift : lo + shift + 4000], memoryview(ours)[lo : lo + 4000])
    assert ours == want


def test_what_it_cannot_copy_is_refused_saying_why() -> None:
    buf = bytearray(8192)
    with pytest.raises(ValueError, match="dst has 100 bytes, src 99"):
        _native.copy(memoryview(buf)[:100], bytes(99))
    with pytest.raises(ValueError, match="writable"):
        _native.copy(bytes(10), bytes(10))
    with pytest.raises(TypeError, match=r"copy\(dst, src\)"):
        _native.copy(buf)  # type: ignore[call-arg]
