"""Sleep until a 32-bit word in shared memory changes, and wake such sleepers: Linux futexes.

A waiter that has spun long enough sleeps in the kernel on the word it waits for; the rank
that changes the word wakes it. The kernel checks the word under its own lock before
sleeping, so a wake that comes after the change is never lost. Shared (not PRIVATE) futexes
work across processes that map the same memory. Where the syscall is unavailable (not
Linux, or an architecture whose number we do not know) `wait` just sleeps a little: slower
wake-ups, same correctness, because every caller re-checks its condition in a loop.
"""

from __future__ import annotations

import ctypes
import platform
import sys
import time

from .. import _config

_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(
    platform.machine().lower()
)
_WAKE_ALL = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load():
    if not sys.platform.startswith("linux") or _SYS_FUTEX is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # CDLL calls release the GIL
        fn = libc.syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [
        ctypes.c_long,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
    ]
    return fn


_syscall = _load()
AVAILABLE = _syscall is not None and _config.get("PYCOLLECTIVE_SHM_FUTEX") != "0"


def wait(address: int, expected: int, timeout: float) -> None:
    """Sleep while the 32-bit word at `address` equals `expected` (its low 32 bits), at most
    `timeout` seconds. Returns early on a wake, a change, or a signal: callers re-check."""
    if not AVAILABLE:
        time.sleep(min(timeout, 200e-6))
        return
    ts = _Timespec(int(timeout), int((timeout % 1.0) * 1e9))
    value = expected & 0xFFFFFFFF
    if value >= 1 << 31:
        value -= 1 << 32  # the syscall takes a signed int
    _syscall(_SYS_FUTEX, address, _FUTEX_WAIT, value, ctypes.addressof(ts), None, 0)


def wake(address: int) -> None:
    """Wake every process sleeping on the word at `address`."""
    if AVAILABLE:
        _syscall(_SYS_FUTEX, address, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)
