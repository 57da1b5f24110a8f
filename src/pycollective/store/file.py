"""FileStore: a store in one file on a filesystem every rank sees (init_method="file://...").

The file is an append-only log of records, written under an exclusive fcntl lock and read
under a shared one; each instance replays only the records it has not seen yet. Blocking
calls poll the file with a capped backoff. As with torch's FileStore, the file counts its
open instances and the last one to close removes it, so a later job that reuses the path
does not read this job's keys; a job that crashes leaves the file behind, so give each job
a fresh path.

The path is often in a directory others can write, where a name can be planted before the
job comes: a file of another user's holding keys the job would read, a file open to
others, a link (or a second hard link) to a file of the job's user that records would be
appended to. So the file is opened without following links, created 0600, and must be a
regular file with one name, owned by this user and closed to group and others (like ssh's
files); anything else is refused with a StoreError saying why and what to do.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import threading
import time
from collections.abc import Iterator, Sequence

from .. import _files
from .._errors import StoreError
from ._base import (
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    Store,
    Timeout,
    add_to_counter,
    check_keys,
    compare_set_result,
    encode_key,
    encode_value,
    timeout_error,
)

_RECORD = struct.Struct("!cII")  # kind, key length, value length
_SET, _DELETE = b"S", b"D"
# Not valid UTF-8, so no user key (always a str) can collide with it.
_USERS = b"\xffusers"


class FileStore(Store):
    """A store shared by processes through the file at `path` (created if missing)."""

    def __init__(self, path: str | os.PathLike[str], timeout: Timeout = 300.0) -> None:
        super().__init__(timeout)
        self._path = os.fspath(path)
        self._data: dict[bytes, bytes] = {}
        self._offset = 0
        self._tlock = threading.Lock()  # flock is per open file, not per thread
        self._fd: int | None = None
        while self._fd is None:
            fd = _open(self._path)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                # The last user of a previous job may have unlinked the file between our
                # open and our lock; joining that orphaned inode would strand us alone.
                if self._same_file(fd):
                    self._refresh(fd, exclusive=True)
                    self._fd = fd
                    self._append_set(_USERS, str(self._users() + 1).encode())
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            if self._fd is None:
                os.close(fd)

    @property
    def path(self) -> str:
        return self._path

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        with self._tlock:
            fd = self._fd
            if fd is None:
                raise StoreError(f"the store file {self._path} is closed")
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                self._refresh(fd, exclusive)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _refresh(self, fd: int, exclusive: bool) -> None:
        size = os.fstat(fd).st_size
        if size < self._offset:  # someone truncated the file: start over
            self._offset = 0
            self._data.clear()
        if size == self._offset:
            return
        data = os.pread(fd, size - self._offset, self._offset)
        pos = 0
        while pos + _RECORD.size <= len(data):
            kind, klen, vlen = _RECORD.unpack_from(data, pos)
            if kind not in (_SET, _DELETE) or klen > MAX_KEY_BYTES or vlen > MAX_VALUE_BYTES:
                raise StoreError(
                    f"the store file {self._path} is corrupt at byte {self._offset + pos}"
                )
            end = pos + _RECORD.size + klen + vlen
            if end > len(data):
                break
            key = data[pos + _RECORD.size : pos + _RECORD.size + klen]
            if kind == _SET:
                self._data[key] = data[pos + _RECORD.size + klen : end]
            else:
                self._data.pop(key, None)
            pos = end
        self._offset += pos
        if exclusive and self._offset < size:
            # Only a writer that died mid-record leaves a torn tail; drop it before appending.
            os.ftruncate(fd, self._offset)

    def _append(self, record: bytes) -> None:
        assert self._fd is not None
        written = 0
        while written < len(record):
            written += os.pwrite(self._fd, record[written:], self._offset + written)
        self._offset += len(record)

    def _append_set(self, key: bytes, value: bytes) -> None:
        self._append(_RECORD.pack(_SET, len(key), len(value)) + key + value)
        self._data[key] = value

    def _users(self) -> int:
        return int(self._data.get(_USERS, b"0"))

    def _poll(self, keys: list[bytes], seconds: float | None) -> list[bytes]:
        """Wait for `keys`; return the missing ones on timeout."""
        deadline = None if seconds is None else time.monotonic() + seconds
        delay = 0.001
        while True:
            with self._locked(exclusive=False):
                missing = [k for k in keys if k not in self._data]
            if not missing:
                return []
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return missing
            time.sleep(delay if remaining is None else min(delay, remaining))
            delay = min(delay * 2, 0.05)

    def _where(self) -> str:
        return f"the store file {self._path}"

    def set(self, key: str, value: bytes | str) -> None:
        k, v = encode_key(key), encode_value(value)
        with self._locked(exclusive=True):
            self._append_set(k, v)

    def get(self, key: str, timeout: Timeout = None) -> bytes:
        k = encode_key(key)
        seconds = self._resolve(timeout)
        if self._poll([k], seconds):
            raise timeout_error([key], seconds, self._where())
        with self._locked(exclusive=False):
            value = self._data.get(k)
        if value is None:  # deleted between the poll and the read
            return self.get(key, timeout)
        return value

    def add(self, key: str, amount: int) -> int:
        k = encode_key(key)
        with self._locked(exclusive=True):
            new = add_to_counter(self._data.get(k), key, int(amount))
            self._append_set(k, str(new).encode("ascii"))
        return new

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        k, e, d = encode_key(key), encode_value(expected), encode_value(desired)
        with self._locked(exclusive=True):
            result, store = compare_set_result(self._data.get(k), e, d)
            if store:
                self._append_set(k, d)
        return result

    def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        names = check_keys(keys)
        seconds = self._resolve(timeout)
        missing = self._poll([encode_key(k) for k in names], seconds)
        if missing:
            raise timeout_error(names, seconds, self._where(), [m.decode() for m in missing])

    def check(self, keys: Sequence[str]) -> bool:
        wanted = [encode_key(k) for k in check_keys(keys)]
        with self._locked(exclusive=False):
            return all(k in self._data for k in wanted)

    def delete_key(self, key: str) -> bool:
        k = encode_key(key)
        with self._locked(exclusive=True):
            if k not in self._data:
                return False
            self._append(_RECORD.pack(_DELETE, len(k), 0) + k)
            del self._data[k]
            return True

    def num_keys(self) -> int:
        with self._locked(exclusive=False):
            return len(self._data) - (_USERS in self._data)

    def close(self) -> None:
        if self._fd is None:
            return
        try:
            with self._locked(exclusive=True):
                users = self._users() - 1
                if users > 0:
                    self._append_set(_USERS, str(users).encode())
                else:
                    self._unlink_if_ours()
        except (OSError, StoreError):
            pass  # closing must not fail; the file is only left behind
        with self._tlock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _same_file(self, fd: int) -> bool:
        mine = os.fstat(fd)
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def _unlink_if_ours(self) -> None:
        assert self._fd is not None
        if self._same_file(self._fd):
            os.unlink(self._path)

    def __repr__(self) -> str:
        return f"FileStore({self._path!r})"


def _open(path: str) -> int:
    """The store file, created 0600 if missing; refused unless it is private to us."""
    try:
        fd = _files.open_private(path, os.O_RDWR | os.O_CREAT)
    except _files.UnsafePath as exc:
        raise StoreError(
            f"refusing the store file {exc} (a store file that others made or can change "
            "could inject keys into the job)"
        ) from None
    except OSError as exc:
        raise StoreError(f"cannot open the store file {path}: {exc}") from exc
    links = os.fstat(fd).st_nlink
    if links > 1:
        os.close(fd)
        raise StoreError(
            f"refusing the store file {path}: it has {links} names (a hard link to another "
            "file); remove it or choose another path"
        )
    return fd
