# The compiled core's Python face (csrc/module.c), for type checkers. The extension is
# optional: every importer falls back to its Python twin when the import fails.
from collections import deque
from typing import Any

CONSTANTS: dict[str, int]
ITEMSIZE: dict[int, int]
KERNELS: str
KIND_CODE: dict[str, int]
OP_CODE: dict[str, int]

def reduce(op: int, dtype: int, out: Any, srcs: Any, avg: int = 0) -> None: ...
def kernel_sets() -> list[str]: ...
def use_kernels(name: str) -> str: ...
def peer_read(pid: int, address: int, nbytes: int) -> bytes: ...
def copy(dst: Any, src: Any) -> None: ...
def recv_reduce(
    fd: int, dst: Any, scratch: Any, have: int, op: int, dtype: int, budget: int
) -> tuple[int, int, int, int]: ...
def swap_round(
    fd: int,
    head: Any,
    payload: Any,
    rbuf: Any,
    spin: float,
    into: Any,
    dst: Any,
    op: int,
    dtype: int,
) -> tuple[int, int, int, int, int, int]: ...

class Plan:
    collective: int  # read-only: the code it was made with
    def __init__(
        self, collective: int, dtype: int, op: int, root: int, avg: int, header: Any
    ) -> None: ...

class Arena:
    def __init__(
        self,
        memory: Any,
        ctrl_offset: int,
        data_offset: int,
        size: int,
        rank: int,
        slot_bytes: int,
        nbuf: int,
        small_bytes: int,
        chunk_bytes: int,
        nt_bytes: float = ...,
    ) -> None: ...
    next_buf: Any
    failure: tuple[int, int]
    def set_single_copy(
        self, min_bytes: int, piece_bytes: int, pids: Any, reduce_min_bytes: int = ...
    ) -> None: ...
    def __getattr__(self, name: str) -> Any: ...

class GroupState:
    seq: int
    failed: Any
    polled: bool
    checked_at: float

class EngineState:
    lock: Any
    queue: deque[Any]
    deferred: list[Any]
    owner: Any
    running: Any
    stopped: bool
    def __init__(self, lock: Any, queue: deque[Any], deferred: list[Any]) -> None: ...

class CallPath:
    def __init__(self, *args: Any) -> None: ...
    def __getattr__(self, name: str) -> Any: ...

class SwapPath:
    def __init__(self, *args: Any) -> None: ...
    def __getattr__(self, name: str) -> Any: ...
