"""One collective call as an API function hands it to its group (ProcessGroup.run_collective).

`CollectiveCall` is the whole call: its buffers, its signature and how the caller waits.
Its signature (the fields at KEY) is what makes two calls the same kind of call: the group
works out a call's runner, algorithm, kernel, plan and frame header once per signature,
and finds them again by `call[KEY]`, a plain tuple that equals and hashes like the
`CallKey` with the same fields (a slice of a tuple is the cheapest key to make per call;
_prepare reads the fields by name through CallKey).

Arguments are checked before the record is built: from run_collective on, a failure is the
group's, reported to every peer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .._dtypes import DType
from .._reduce_ops import ReduceOp


class CallKey(NamedTuple):
    """A call's signature. `root` is a group rank; `header_count` is the count its frames
    carry when it is not `count` (all_to_all: 0, its splits may differ by rank);
    `send_counts`/`recv_counts` are all_to_all's elements to and from each rank."""

    collective: str
    count: int  # type: ignore[assignment]  # shadows tuple.count, which no one calls here
    dtype: DType
    algorithm: str | None = None  # None: the configured choice (_config.algorithm_choice)
    op: ReduceOp | None = None
    root: int = 0
    header_count: int | None = None
    send_counts: tuple[int, ...] | None = None
    recv_counts: tuple[int, ...] | None = None


class CollectiveCall(NamedTuple):
    """One call: its buffers by role (`arrays`: "data", or "input" and "output"), its
    signature (CallKey's fields, in order, at KEY), a step to run after it succeeds
    (`after`: copies out, AVG's division), whether it returns a Work (`async_op`, whose
    result is `result`), and `fast_key`: (the caller's buffer, the op or root object as the
    caller passed it) when the group's compiled path may learn to repeat the call (a
    synchronous call with every argument checked); a call of two buffers gives the pair
    (output, input) for the buffer, reduce the pair (dst, op) for the object."""

    arrays: dict[str, np.ndarray]
    collective: str
    count: int  # type: ignore[assignment]  # shadows tuple.count, which no one calls here
    dtype: DType
    algorithm: str | None = None
    op: ReduceOp | None = None
    root: int = 0
    header_count: int | None = None
    send_counts: tuple[int, ...] | None = None
    recv_counts: tuple[int, ...] | None = None
    after: Callable[[], None] | None = None
    async_op: bool = False
    result: Any = None
    fast_key: tuple[Any, Any] | None = None

    @property
    def key(self) -> CallKey:
        return CallKey._make(self[1:10])


KEY = slice(1, 10)  # where CollectiveCall holds CallKey's fields
if CollectiveCall._fields[1:10] != CallKey._fields:
    raise AssertionError("CollectiveCall must hold CallKey's fields, in order, at KEY")
