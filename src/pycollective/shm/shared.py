"""Arrays in shared memory that a group's peers read directly (`pycollective.empty`, made in
api/memory.py).

Each array gets its own anonymous memory file (memfd_create): it has no name in /dev/shm,
so no exit path (normal, exception, signal, kill -9) can leave anything behind, and no
resource tracker is involved. The memory lives while the owner's array or a peer's
mapping of it does. The owner keeps the file descriptor open while its array lives;
peers open the same file through /proc/<owner pid>/fd/<fd> when a collective first names
it (the call's announcement carries fd, inode, offset and length) and check the inode,
so a recycled descriptor or a pid from another namespace can never map the wrong file.

Peers cache their mappings per owner; on a miss they drop cached mappings whose owner
closed the file (the fd no longer leads to that inode), so a peer holds no memory its
owner has freed past the owner's next new buffer.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import threading
import weakref
from collections import OrderedDict

import numpy as np

_PAGE = mmap.PAGESIZE
NOT_SHARED = (0, 0, 0, 0)
_MAX_CACHED = 64  # mappings kept per peer group


class _Registry:
    """This process's live shared blocks, by start address: (start, nbytes, fd, inode)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._blocks: dict[int, tuple[int, int, int]] = {}

    def add(self, start: int, nbytes: int, fd: int, ino: int) -> None:
        with self._lock:
            bisect.insort(self._starts, start)
            self._blocks[start] = (nbytes, fd, ino)

    def remove(self, start: int) -> None:
        with self._lock:
            info = self._blocks.pop(start, None)
            if info is not None:
                self._starts.remove(start)

    def find(self, address: int, nbytes: int) -> tuple[int, int, int, int] | None:
        """(fd, inode, offset, block length) of the block holding [address, +nbytes)."""
        with self._lock:
            i = bisect.bisect_right(self._starts, address) - 1
            if i < 0:
                return None
            start = self._starts[i]
            length, fd, ino = self._blocks[start]
        if address + nbytes > start + length:
            return None
        return fd, ino, address - start, length

    def __len__(self) -> int:
        return len(self._blocks)


_REGISTRY = _Registry()


def _release(start: int, fd: int) -> None:
    _REGISTRY.remove(start)
    with contextlib.suppress(OSError):
        os.close(fd)


def allocate(nbytes: int) -> np.ndarray:
    """`nbytes` of shared memory as a uint8 array (pages reserved now: a full memory
    fails here with an OSError instead of a SIGBUS later)."""
    if not hasattr(os, "memfd_create"):
        raise OSError("shared arrays need memfd_create (Linux)")
    length = max(_PAGE, -(-nbytes // _PAGE) * _PAGE)
    fd = os.memfd_create("pycollective", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, length)
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, length)
        mm = mmap.mmap(fd, length)
        ino = os.fstat(fd).st_ino
    except BaseException:
        os.close(fd)
        raise
    raw = np.frombuffer(mm, np.uint8)
    start = raw.ctypes.data
    _REGISTRY.add(start, length, fd, ino)
    weakref.finalize(mm, _release, start, fd)  # when the last array on it goes
    return raw[:nbytes]


def describe(arr: np.ndarray) -> tuple[int, int, int, int]:
    """What a call announces about its buffer: (fd + 1, inode, offset, block length) if
    `arr` lies in one of this process's shared blocks, else NOT_SHARED."""
    if not len(_REGISTRY) or not arr.nbytes:
        return NOT_SHARED
    found = _REGISTRY.find(arr.ctypes.data, arr.nbytes)
    if found is None:
        return NOT_SHARED
    fd, ino, off, length = found
    return fd + 1, ino, off, length


def is_shared(arr: np.ndarray) -> bool:
    return describe(arr) != NOT_SHARED


class PeerMaps:
    """One group's mappings of its peers' shared blocks, cached."""

    def __init__(self) -> None:
        self._maps: OrderedDict[tuple[int, int, int], mmap.mmap] = OrderedDict()

    def view(
        self, pid: int, fd1: int, ino: int, off: int, length: int, dtype: np.dtype, count: int
    ) -> np.ndarray:
        """Rank's announced buffer as `count` elements of `dtype`. Raises OSError if it
        cannot be mapped (or is not what was announced)."""
        key = (pid, fd1 - 1, ino)
        mm = self._maps.get(key)
        if mm is None:
            self._prune(pid)
            mm = self._maps[key] = _open(pid, fd1 - 1, ino, length)
            while len(self._maps) > _MAX_CACHED:
                self._maps.popitem(last=False)
        else:
            self._maps.move_to_end(key)
        if off < 0 or off + count * dtype.itemsize > len(mm):
            raise OSError(f"announced buffer [{off}, +{count} x {dtype}) exceeds its block")
        return np.frombuffer(mm, dtype, count, off)

    def _prune(self, pid: int) -> None:
        """Forget this owner's blocks that it has closed."""
        for key in [k for k in self._maps if k[0] == pid]:
            try:
                alive = os.stat(f"/proc/{pid}/fd/{key[1]}").st_ino == key[2]
            except OSError:
                alive = False
            if not alive:
                del self._maps[key]

    def __len__(self) -> int:
        return len(self._maps)


def _open(pid: int, fd: int, ino: int, length: int) -> mmap.mmap:
    path = f"/proc/{pid}/fd/{fd}"
    mine = os.open(path, os.O_RDWR)
    try:
        st = os.fstat(mine)
        if st.st_ino != ino or st.st_size < length:
            raise OSError(f"{path} is not the announced block (inode {st.st_ino}, {ino} expected)")
        return mmap.mmap(mine, length)
    finally:
        os.close(mine)
