"""The compiled reduction of a TCP payload as it arrives: pycollective._native's
recv_reduce, if the extension is there, agrees with this package's codes and is wanted
(PYCOLLECTIVE_TCP_NATIVE=1, off by default; PYCOLLECTIVE_NATIVE). receiving.py calls it
for a sink whose receive says what its reduction is (InMessage.fold); otherwise, and
under TLS, the payload goes through the window to the sink in Python (the reference).
It also hands swap.py the compiled round of the small swap (`compiled_round`) and the
compiled path around it (`compiled_swap_path`), and receiving.py the compiled copy out of
the read buffer (`compiled_copy`)."""

from __future__ import annotations

from collections.abc import Callable

from ... import _config
from ..._reduce_ops import kernel_code_differences

try:
    from ... import _native
except ImportError:  # not built: Python reduces
    _native = None  # type: ignore[assignment]

# Read through this much of the window at a time: a read's bytes are combined into the
# destination while they are still in L2 (and the window's lines stay there).
FOLD_PIECE_BYTES = 256 << 10
# Bytes read a call at most, so the exchange's sends get their turn in between.
FOLD_BUDGET_BYTES = 1 << 20

RecvReduce = Callable[[int, memoryview, memoryview, int, int, int, int], tuple[int, int, int, int]]


def _agrees(native: object) -> bool:
    """Whether the extension has recv_reduce and numbers ops and dtypes as we do (an old
    or foreign build would combine with the wrong kernel)."""
    return hasattr(native, "recv_reduce") and not kernel_code_differences(native)


def compiled() -> RecvReduce | None:
    """The extension's recv_reduce if it is there and agrees with us, wanted or not."""
    if _native is None or not _agrees(_native):
        return None
    return _native.recv_reduce


def native_fold() -> RecvReduce | None:
    """recv_reduce if the compiled path is usable and wanted (PYCOLLECTIVE_TCP_NATIVE=1;
    off by default: it measured no faster than numpy's, docs/tcp.md), else None."""
    if _config.get("PYCOLLECTIVE_NATIVE") != "1" or _config.get("PYCOLLECTIVE_TCP_NATIVE") != "1":
        return None
    return compiled()


SwapRound = Callable[..., tuple[int, int, int, int, int, int]]


def compiled_round() -> SwapRound | None:
    """The extension's swap_round (swap.py: one round of the small swap, sent, polled
    for and reduced with the GIL released) if the compiled core is usable and wanted
    (PYCOLLECTIVE_NATIVE, on by default), else None: the Python loop, the reference."""
    if _config.get("PYCOLLECTIVE_NATIVE") != "1" or _native is None or not _agrees(_native):
        return None
    return getattr(_native, "swap_round", None)


def compiled_swap_path(group_state: object, engine_state: object) -> type | None:
    """The extension's SwapPath (csrc/swappath.c: the whole repeated small swap in C) where
    the group's and engine's states are the extension's C-owned records it reads, else
    None. Its caller (TCPTransport.compiled_path) checks that the compiled round is on."""
    if _native is None or not (
        isinstance(group_state, _native.GroupState)
        and isinstance(engine_state, _native.EngineState)
    ):
        return None
    return getattr(_native, "SwapPath", None)


# Copies shorter than this stay with memoryview's: glibc's vector moves have no slow case
# there, and the call would cost more than it saves (csrc/copy.c).
COPY_FROM_BYTES = 2048


def compiled_copy() -> Callable[[memoryview, memoryview], None] | None:
    """The extension's copy (csrc/copy.c) if the compiled core is usable and wanted
    (PYCOLLECTIVE_NATIVE), else None: memoryview's own copy, the reference. A payload
    copied out of the read buffer lies 44 bytes (a header) past a line, and memcpy from
    there into an aligned destination ran at 2.4-3 GB/s on AMD EPYC against 35-50 GB/s."""
    if _config.get("PYCOLLECTIVE_NATIVE") != "1" or _native is None:
        return None
    return getattr(_native, "copy", None)
