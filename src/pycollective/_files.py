"""Private files and directories: what every file the library writes or trusts goes through.

Paths the library uses often sit in directories other users can write (/tmp, a shared
FileStore directory, a job's scratch space), where a name can be planted before we use
it: a symbolic link to a victim's file (our write would overwrite it), a file or
directory of another user (its owner could read what we write, or feed us what we read).
So, like ssh with its keys:

* a directory of ours is made 0700 and, when it exists already, must be a real directory
  owned by us with no permissions for group or others (`private_dir`);
* a file is written to a fresh temporary name (O_EXCL|O_NOFOLLOW, 0600) and renamed over
  the path, so a planted link is replaced rather than followed and a reader never sees
  half a file (`write_private`, `replacing`); or linked into place only if the name is
  free (`create_private`);
* a file we trust is opened without following links and must be a regular file owned by
  us, not readable or writable by group or others (`read_private`, `open_private`).

Refusals raise UnsafePath (a UsageError) saying what is wrong and how to fix it.

A leaf: it imports nothing of the package but the errors.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import stat
from collections.abc import Iterator
from typing import IO, Any, Literal

from ._errors import UsageError

try:
    import pwd  # POSIX: a user's name makes a refusal easier to act on
except ImportError:  # pragma: no cover - not POSIX
    pwd = None  # type: ignore[assignment]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted where a file should be: no hang


class UnsafePath(UsageError):
    """A path the library will not trust: a link, another user's, or open to others."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        super().__init__(f"{path}: {problem}; {fix}")
        self.path = path
        self.problem = problem
        self.fix = fix


def _euid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else 0


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (AttributeError, KeyError):
        return f"uid {uid}"


def mode_problem(mode: int) -> str | None:
    """What group and others may do with a file of this mode, in words ("mode 0644:
    readable by group, readable by others"), or None when they may do nothing."""
    bits = stat.S_IMODE(mode)
    if not bits & 0o077:
        return None
    said = []
    for who, shift in (("group", 3), ("others", 0)):
        can = [
            word
            for bit, word in ((4, "readable"), (2, "writable"), (1, "executable"))
            if bits >> shift & bit
        ]
        if can:
            said.append(f"{' and '.join(can)} by {who}")
    return f"mode {bits:04o}: {', '.join(said)}"


def check_owned(st: os.stat_result, path: str, kind: Literal["file", "directory"]) -> None:
    """Raise UnsafePath unless `st` (an fstat/lstat of `path`) is a `kind` owned by the
    effective user with no permissions for group or others."""
    is_kind = stat.S_ISDIR(st.st_mode) if kind == "directory" else stat.S_ISREG(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(
            path, "is a symbolic link", f"use a real {kind} (links are never followed)"
        )
    if not is_kind:
        raise UnsafePath(path, f"is not a {kind}", "remove it or choose another path")
    me = _euid()
    if st.st_uid != me:
        raise UnsafePath(
            path,
            f"is owned by {_user(st.st_uid)}, not by this process's user ({_user(me)})",
            "remove it or choose another path",
        )
    problem = mode_problem(st.st_mode)
    if problem is not None:
        private = "700" if kind == "directory" else "600"
        raise UnsafePath(path, problem, f"make it private: chmod {private} {path}")


# ---------------------------------------------------------------------- directories


def private_dir(path: str | os.PathLike[str], create: bool = True) -> str:
    """`path` as a private directory: made 0700 when missing (with its parents, made as
    os.makedirs would; only the last is judged), else checked to be a real directory (not
    a link) owned by this user with no permissions for group or others. Returns the path;
    raises UnsafePath (or OSError when it cannot be made or opened)."""
    path = os.fspath(path)
    if create:
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            check_owned(os.lstat(path), path, "directory")  # raises with the reason
        raise
    try:
        check_owned(os.fstat(fd), path, "directory")
    finally:
        os.close(fd)
    return path


def ensure_dir(path: str | os.PathLike[str]) -> str:
    """`path` made 0700 if it is missing (parents as os.makedirs makes them); an existing
    directory is left as it is: for places the user named, which are theirs to judge."""
    path = os.fspath(path)
    if path and not os.path.isdir(path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    return path


# ---------------------------------------------------------------------- writing


def _temp_beside(path: str) -> tuple[int, str]:
    """A new file (0600, O_EXCL, never through a link) with a random name in the directory
    of `path`: its file descriptor and name."""
    directory, name = os.path.split(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    while True:
        tmp = os.path.join(directory, f".{name}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue  # 64 random bits taken: someone else's; draw again


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], text: bool = True) -> Iterator[IO[Any]]:
    """Write a private file (0600) in place of `path`, all or nothing: what is written to
    the file object goes to a fresh temporary file beside it, renamed over `path` when the
    block ends without an exception (a link planted at `path` is replaced, never followed);
    on an exception it is removed and `path` is untouched."""
    path = os.fspath(path)
    fd, tmp = _temp_beside(path)
    try:
        raw = os.fdopen(fd, "wb")
        f: IO[Any] = io.TextIOWrapper(raw, encoding="utf-8") if text else raw
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_private(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Replace `path` atomically with a private file (0600) holding `data` (see
    `replacing`)."""
    with replacing(path, text=False) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def create_private(path: str | os.PathLike[str], data: bytes | str) -> bool:
    """Create `path` (0600) holding `data` if nothing is there: True if this call made it,
    False if a file (or anything else, a link included) was there already. Never seen half
    written: the data goes to a temporary file first, hard-linked to `path` (which fails if
    the name is taken, and never follows a link)."""
    path = os.fspath(path)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            return _create_in_place(path, payload)  # a filesystem without hard links
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _create_in_place(path: str, payload: bytes) -> bool:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    return True


# ---------------------------------------------------------------------- reading


def open_private(path: str | os.PathLike[str], flags: int = os.O_RDONLY) -> int:
    """Open `path` with `flags` (O_CREAT makes it 0600), never through a link, and return
    the descriptor if it is a regular file of this user that group and others cannot
    touch; else close it and raise UnsafePath."""
    path = os.fspath(path)
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(
                path, "is a symbolic link", "use the file itself (links are never followed)"
            ) from None
        raise
    try:
        check_owned(os.fstat(fd), path, "file")
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_private(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The contents of `path`, a private file (see `open_private`) of at most `max_bytes`
    bytes; UnsafePath if it is not private or is larger, OSError if it cannot be read."""
    path = os.fspath(path)
    fd = open_private(path)
    try:
        chunks, got = [], 0
        while got <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > max_bytes:
        raise UnsafePath(
            path,
            f"is larger than the {max_bytes} bytes expected",
            "check that it is the right file",
        )
    return b"".join(chunks)


__all__ = [
    "UnsafePath",
    "check_owned",
    "create_private",
    "ensure_dir",
    "mode_problem",
    "open_private",
    "private_dir",
    "read_private",
    "replacing",
    "write_private",
]
