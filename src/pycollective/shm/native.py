"""The compiled arena: shm's collectives run by pycollective._native, with the error
semantics left in Python.

The extension works on the same segment, control words and buffers as arena.py and
collectives.py (same phases, same buffers, same share boundaries, the same fused
reductions in rank order), so its results are those of the Python arena bit for bit, and
a rank running one path meets a rank running the other in the same call. A call runs in C
until it is done or needs Python (see csrc/arena.h): about every millisecond of
waiting (`poll`: deadline, abort notices, lost peers, exactly as the Python arena polls),
when a peer's announcement differs from ours after the first wait (`check`: the caller
decides whether that is a mismatch and words it), and when every rank's buffer may be
shared memory (`views`: the peers' buffers, mapped by shared.py).

`PYCOLLECTIVE_NATIVE=0`, or an extension that is missing (not built, or built for another
Python), runs the Python arena instead; the latter warns once, saying why.
"""

from __future__ import annotations

import errno as _errno
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .. import _callstate, _config, _load
from .._errors import TransportError
from .._reduce_ops import kernel_code_differences
from . import arena as _arena
from . import collectives as _coll
from .arena import NBUF, Arena, layout

try:
    from .. import _native
except ImportError as exc:  # not built: the Python arena runs
    _native = None  # type: ignore[assignment]
    _MISSING = f"{exc}"
else:
    _MISSING = ""

# What Arena.run and resume return (csrc/arena.h)
DONE, PENDING, CHECK, VIEWS, FAILED = 0, 1, 2, 3, 4
BUDGET_NS = 1_000_000  # how long C waits before handing back to Python for a poll
# Calls at least this large copy results into the caller's buffer with non-temporal stores
# (they skip reading the destination in first, and leave the cache alone): they pay only
# once the call's data no longer stays in cache, so the default is the L3's size. On a
# 32 MiB-L3 host, pinned p=2 all_reduce, alternating: 64 MiB 8.6 ms with them, 12.7 ms
# without, 16 MiB 2.1 / 1.6 ms. On this VM's 260 MiB L3, alternating (load 11-13 and
# 17, medians of 15 and 11; benchmarks/results/arena_variants.jsonl): 32 MiB 59 / 149 ms
# with them from 32 MiB, 48 / 107 ms without; 64 MiB 154 / 291 ms and 107 / 229 ms.
# PYCOLLECTIVE_SHM_NT_BYTES overrides.
NT_FALLBACK_BYTES = 32 << 20
_CACHES = "/sys/devices/system/cpu/cpu0/cache"


def l3_bytes() -> int | None:
    """The size of this CPU's last-level (L3) cache from sysfs, or None if not told."""
    try:
        for index in sorted(os.listdir(_CACHES)):
            if not index.startswith("index"):
                continue
            with open(f"{_CACHES}/{index}/level") as f:
                level = f.read().strip()
            if level != "3":
                continue
            with open(f"{_CACHES}/{index}/size") as f:
                size = f.read().strip().upper()
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            return int(size.rstrip("KMG")) * unit
    except (OSError, ValueError):
        return None
    return None


def nt_threshold() -> int:
    """Calls at least this large copy their results out non-temporally (see above)."""
    override = _config.get("PYCOLLECTIVE_SHM_NT_BYTES")
    if override is not None:
        return int(override)
    return l3_bytes() or NT_FALLBACK_BYTES


# With more ranks than cores, a wait yields for at most this long before it sleeps on the
# futex, so that the core goes to the ranks that have work (the one waited on among them):
# p=4 on 2 cores, alternating in the same ranks, a 4 B all_reduce took 23-24 us yielding
# 30-300 us first and 62 us sleeping at once; 16 MiB 25-27 ms and 23 ms.
OVERSUBSCRIBED_YIELD_SECONDS = 50e-6
# A rank pinned to a core of its own (mpirun's binding; ranks not outnumbering cores)
# spins this long before it yields: yielding hands its core to whatever else runs there
# for a time slice, and a phase then costs milliseconds on a busy machine. Pinned p=2,
# alternating in the same ranks (load 7): 1 / 4 / 16 MiB 43 us / 0.44 / 2.5 ms spinning
# 100 us first, 141 us / 0.75 / 3.9 ms yielding at once. Unpinned ranks do not spin: two
# of them may share a core, and a spinner then keeps its peer off it.
PINNED_SPIN_SECONDS = 100e-6


def contract_differences(ext: Any, kind_code: Mapping[str, int] | None = None) -> list[str]:
    """Where the values an extension compiled in differ from their definitions here (the
    arena's layout, the status codes, dtype and op codes, the call state's fields; and with
    `kind_code`, the wire's numbering of collectives, which transport/_wire.py defines):
    Python is the definition, and C is checked against it rather than trusted to be a
    copy."""
    want = {
        "WORDS": _arena.WORDS,
        "EPOCH": _arena.EPOCH,
        "SLEEPING": _arena.SLEEPING,
        "SEQ": _arena.SEQ,
        "KIND": _arena.KIND,
        "ANN_WORDS": _arena.ALGO - _arena.KIND + 1,
        "BUF_FD": _arena.BUF_FD,
        "BUF_WORDS": _arena.BUF_LEN - _arena.BUF_FD + 1,
        "ADDR": _arena.ADDR,
        "SC_ERR": _arena.SC_ERR,
        "H_CLAIM": _arena.H_CLAIM,
        "MAX_RANKS": _arena.MAX_RANKS,
        "ALIGN_BYTES": _coll.ALIGN_BYTES,
        "SLEEP_NS": round(_arena.SLEEP_SECONDS * 1e9),
        "SETTLE_SPINS": _arena.SETTLE_SPINS,
        "LOAD_CHECK_NS": round(_load.CHECK_SECONDS * 1e9),
        "DONE": DONE,
        "PENDING": PENDING,
        "CHECK": CHECK,
        "VIEWS": VIEWS,
        "FAILED": FAILED,
    }
    tables: list[tuple[str, dict[Any, Any], dict[Any, Any]]] = [("", want, ext.CONSTANTS)]
    if kind_code is not None:
        tables.append(("code of ", {k: kind_code.get(k) for k in ext.KIND_CODE}, ext.KIND_CODE))
    return (
        [
            f"{what}{key}: {theirs.get(key)} in C, {mine.get(key)} in Python"
            for what, mine, theirs in tables
            for key in sorted(set(mine) | set(theirs), key=str)
            if mine.get(key) != theirs.get(key)
        ]
        + kernel_code_differences(ext)
        + _callstate.differences(ext)
    )


if _native is not None and (_differences := contract_differences(_native)):
    _MISSING = (
        "it was built from other sources than this Python code (" + "; ".join(_differences)
        + ")"
    )  # fmt: skip
    _native = None  # type: ignore[assignment]


def enabled(kind_code: Mapping[str, int] | None = None) -> bool:
    """Whether arena calls run compiled: PYCOLLECTIVE_NATIVE is not 0 and the extension
    loads and agrees with Python's definitions, with `kind_code` (the wire's numbering of
    collectives, given by a layer that may read it) too (if not, one warning says why)."""
    if _config.get("PYCOLLECTIVE_NATIVE") == "0":
        return False
    if _native is not None and kind_code is not None:
        differences = contract_differences(_native, kind_code)
        if differences:
            if _config.first_time("native-kinds"):
                warnings.warn(
                    "pycollective._native numbers collectives unlike transport/_wire.py ("
                    + "; ".join(differences) + "); the shared-memory arena runs in Python. "
                    "Rebuild with `pip install -e .` (or `make setup`).",
                    RuntimeWarning,
                    stacklevel=2,
                )  # fmt: skip
            return False
    if _native is None:
        if _config.first_time("native-missing"):
            warnings.warn(
                f"pycollective._native is not available ({_MISSING}); the shared-memory "
                "arena runs in Python (slower below a few MiB). Rebuild with `pip install -e .` "
                "(or `make setup`); PYCOLLECTIVE_NATIVE=0 silences this.",
                RuntimeWarning,
                stacklevel=2,
            )
        return False
    return True


def kernels() -> str:
    """The kernel set the extension chose for this CPU ("avx512", "avx2", "generic")."""
    return _native.KERNELS if _native is not None else "none"


Poll = Callable[[int], None]
Check = Callable[[int, int], None]
Views = Callable[[], "list[np.ndarray] | None"]


# Single copy (csrc/arena.c run_single): compiled all_reduce calls above SMALL_BYTES on
# ordinary buffers read the peers' data and write them the results straight in their
# buffers, SINGLE_COPY_PIECE_BYTES at a time, where set-up found that every rank can reach
# every other (same user, no Yama restriction, the same pid namespace: `probe_peer`).
# Pieces of 128 KiB: p=2 pinned, alternating in the same ranks at load 10-11, CPU time of
# the busier rank per call (benchmarks/arena_variants.py; docs/shm.md), 1 / 4 / 16 MiB:
# 64 KiB 182-232 us / 0.95-1.11 ms / 3.3-3.6 ms, 128 KiB 155-184 us / 0.91-1.01 ms /
# 3.2 ms, 256 KiB 149-217 us / 0.87-0.94 ms / 3.5-3.6 ms, 512 KiB 178-314 us / 0.95-1.03
# ms / 3.8-4.2 ms; through the arena 247-311 us / 1.2-1.35 ms / 5.0-5.4 ms.
SINGLE_COPY_PIECE_BYTES = 128 << 10


def single_copy_wanted() -> bool:
    """Whether this rank offers single copy at set-up: the compiled arena runs here and
    PYCOLLECTIVE_SHM_SINGLE_COPY is not 0."""
    return _native is not None and _config.get("PYCOLLECTIVE_SHM_SINGLE_COPY") != "0" and enabled()


def probe_peer(pid: int, address: int, nonce: bytes) -> bool:
    """Whether process `pid` holds `nonce` at `address` in its memory, read across
    processes as single copy reads: it is the peer that sent them (not another process
    that has its pid in our namespace), and the system lets us reach it."""
    if _native is None or not 0 < pid < 1 << 31 or not 0 < address < 1 << 64:
        return False
    try:
        return bool(_native.peer_read(pid, address, len(nonce)) == nonce)
    except OSError:
        return False


def single_copy_error(failure: tuple[int, int], rank: int, collective: str) -> TransportError:
    """The error of a single-copy `collective` (all_reduce, broadcast, all_gather,
    reduce_scatter) that failed on this rank or on a peer (`failure`: the errno and the
    arena rank whose buffer could not be reached, by this rank or the peer that failed;
    `rank`: that rank as the caller names it). Every rank
    of the call raises one: no result was returned."""
    code, _ = failure
    name = _errno.errorcode.get(code, str(code))
    return TransportError(
        f"single-copy {collective} with rank {rank} failed: {name} ({os.strerror(code)}) "
        "reading or writing its buffer across processes (process_vm_readv/writev); the data "
        "of this call is undefined. PYCOLLECTIVE_SHM_SINGLE_COPY=0 turns single copy off."
    )


def kind_name(kind: int) -> str:
    """The collective of a kind code (the extension's KIND_CODE, the wire's)."""
    if _native is not None:
        for name, code in _native.KIND_CODE.items():
            if code == kind:
                return name
    return f"<kind {kind}>"


class NativeArena:
    """This rank's compiled view of an Arena (which keeps owning the segment)."""

    def __init__(
        self, arena: Arena, small_bytes: int, chunk_bytes: int, nt_bytes: int | None = None
    ) -> None:
        assert _native is not None  # noqa: S101 - callers check enabled()
        ctrl, data, _ = layout(arena.size, arena.slot_bytes)
        self.arena = arena
        self.c = _native.Arena(
            arena.segment.mm,
            ctrl,
            data,
            arena.size,
            arena.rank,
            arena.slot_bytes,
            NBUF,
            small_bytes,
            chunk_bytes,
            nt_bytes if nt_bytes is not None else nt_threshold(),
        )
        self.c.next_buf = arena.next_buf
        self.set_spin()
        self._plans: dict[tuple, object] = {}

    def set_spin(self) -> None:
        """The Python arena's wait settings (arena.py set_cores), with the compiled
        arena's shorter yield when ranks outnumber cores or the machine is busy, and the
        pinned rank's spin. C reads the machine's load as the Python arena does."""
        a = self.arena
        seconds = a.yield_seconds
        if a.oversubscribed:
            seconds = min(seconds, OVERSUBSCRIBED_YIELD_SECONDS)
        pinned = a.pinned
        spin = PINNED_SPIN_SECONDS if pinned else 0.0
        # A pinned rank waits alike on a busy machine (arena.py set_cores says why).
        busy_seconds = (
            seconds if pinned else min(a.busy_yield_seconds, OVERSUBSCRIBED_YIELD_SECONDS)
        )
        self.c.set_spin(
            a.pure_spins, int(seconds * 1e9), a.oversubscribed, int(spin * 1e9),
            a.busy_spins, int(busy_seconds * 1e9), a.load.cpus,
        )  # fmt: skip

    def plan(
        self,
        kind: int,
        dtype_code: int,
        op: int,
        root: int,
        divisor: int,
        header: tuple[int, int, int, int, int, int],
    ) -> object:
        """The prepared call for this signature (cached): `kind` is the collective's code
        on the wire (transport/_wire.py KIND_CODE, which C shares), header the
        announcement's (kind, dtype, count, root, op, algo)."""
        key = (kind, dtype_code, op, root, divisor, header)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= 4096:
                self._plans.clear()
            plan = self._plans[key] = _native.Plan(kind, dtype_code, op, root, divisor, header)
        return plan

    def call_path(
        self,
        group_state: _callstate.GroupState,
        engine_state: _callstate.EngineState,
        recorder: object,
        entry_type: type,
        finish: Callable[..., None],
        running: str,
        completed: str,
        recheck_seconds: float,
    ) -> object:
        """A group's compiled path of repeated calls over this arena (_native.CallPath; see
        csrc/callpath.c), reading and writing the group's and its engine's state (C-owned:
        _callstate.py): calls that wait past BUDGET_NS are handed to `finish`."""
        return _native.CallPath(
            self.c, group_state, engine_state, recorder, entry_type, finish, running,
            completed, int(recheck_seconds * 1e9), BUDGET_NS,
        )  # fmt: skip

    def run(
        self,
        plan: Any,  # a _native.Plan
        inp: np.ndarray | None,
        out: np.ndarray | None,
        seq: int,
        shared: tuple[int, int, int, int] | None,
        poll: Poll,
        check: Check,
        views: Views,
    ) -> None:
        """Announce and run one call; returns when it is done on this rank. `poll(target)`
        may raise to give up (deadline, dead peer, abort); `check(peer, target)` raises
        MismatchError if peer's announcement is a different call."""
        c = self.c
        rc = c.run(plan, inp, out, seq, BUDGET_NS, shared)
        while rc:
            if rc == FAILED:
                raise single_copy_error(c.failure, c.failure[1], kind_name(plan.collective))
            if rc == PENDING:
                poll(c.target)
            elif rc == CHECK:
                check(c.peer, c.target)
            else:  # VIEWS
                c.set_views(views())
            rc = c.resume(BUDGET_NS)
