"""Files only this user can touch: private directories and files written without following
links, so another user of the host cannot plant a symlink or a file of their own where the
library writes or reads (a key, a dump, a store).

A leaf: imports nothing of the package but the errors.
"""

from __future__ import annotations

import os
import secrets
import stat

from ._errors import UsageError

_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class PrivatePathError(UsageError, PermissionError):
    """A path the library would use is not private to this user."""


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def private_dir(path: str, create: bool = True) -> str:
    """`path` as a directory only this user may enter: made 0700 (with its parents) when
    missing; an existing one must be a real directory of ours with no group or other
    permissions. Returns `path`."""
    if create:
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise PrivatePathError(f"{path} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise PrivatePathError(f"{path} is a symbolic link, not a directory of this user's")
    if not stat.S_ISDIR(st.st_mode):
        raise PrivatePathError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise PrivatePathError(
            f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}): "
            "another user made it; remove it or choose another directory"
        )
    if st.st_mode & 0o077:
        raise PrivatePathError(
            f"{path} has mode {_mode(st)}: others may enter it; chmod 700 {path}"
        )
    return path


def _write_new(path: str, data: bytes) -> None:
    fd = os.open(path, _OPEN_NEW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _temp_beside(path: str) -> str:
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.{secrets.token_hex(6)}.tmp")


def write_private(path: str, data: bytes) -> None:
    """Replace `path` atomically with a new 0600 file holding `data` (the temporary file is
    created exclusively and never through a link; rename replaces a link, never follows it)."""
    tmp = _temp_beside(path)
    _write_new(tmp, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def create_private(path: str, data: bytes) -> bool:
    """Create `path` (0600) holding `data` unless it exists; never seen half-written (written
    aside, then linked into place). True if this call made it."""
    tmp = _temp_beside(path)
    _write_new(tmp, data)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def read_private(path: str, max_bytes: int) -> bytes:
    """The contents of `path`, a regular file of this user's that nobody else may read or
    write (as ssh judges a key file), at most `max_bytes` long."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise PrivatePathError(f"{path} is a symbolic link; refusing to follow it") from None
        raise PrivatePathError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PrivatePathError(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise PrivatePathError(
                f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
            )
        if st.st_mode & 0o077:
            raise PrivatePathError(
                f"{path} has mode {_mode(st)}: others may read or change it; chmod 600 {path}"
            )
        if st.st_size > max_bytes:
            raise PrivatePathError(f"{path} has {st.st_size} bytes; at most {max_bytes} expected")
        chunks = []
        while True:
            chunk = os.read(fd, max_bytes + 1)
            if not chunk:
                break
            chunks.append(chunk)
            if sum(map(len, chunks)) > max_bytes:
                raise PrivatePathError(f"{path} grew past {max_bytes} bytes while being read")
        return b"".join(chunks)
    finally:
        os.close(fd)


__all__ = ["PrivatePathError", "create_private", "private_dir", "read_private", "write_private"]
