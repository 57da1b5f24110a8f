"""torch's call forms: reading the arguments of a ProcessGroup method, and what every
collective method does around its body (`torch_call`).

torch's ProcessGroup methods each take several call forms (pybind overloads in torch's
C++ API): a list of tensors and an options struct, or a bare tensor with a ReduceOp /
RedOpType, an int root and a timeout. C++ callers (DDP's reducer, functional collectives)
use the first; Python code holding a group object uses any. The backend's methods replace
torch's on its subclass, so they accept every form; the helpers below read them.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as tdist
from torch._C import _distributed_c10d as _c10d
from torch._C._profiler import _RecordFunctionFast

import torch

from .._errors import UsageError
from .._reduce_ops import ReduceOp as OurOp
from .._reduce_ops import to_reduce_op
from ._work import torch_error

# Checked per call: whether torch's profiler records (then every call is asynchronous).
profiling = torch.autograd._profiler_enabled


def tensors_of(x: Any, what: str) -> list[torch.Tensor]:
    """A tensor or a sequence of tensors, as a list."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return list(x)
    raise UsageError(f"{what} must be a tensor or a list of tensors, got {type(x).__name__}")


def one(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """The only tensor of a one-tensor-per-process list."""
    if len(tensors) != 1:
        raise UsageError(f"{op} takes exactly one tensor per process, got {len(tensors)}")
    return tensors[0]


def is_options(x: Any) -> bool:
    return type(x).__name__.endswith("Options")


# torch's RedOpType -> ours, and torch's ReduceOp objects -> ours by their hash; filled
# on first use of each. An options struct's `reduceOp` is a new ReduceOp each time, which
# hashes as its RedOpType's value: a dictionary keyed by the ReduceOp itself finds it only
# after calling its pybind __eq__ (1.3 µs a call), one keyed by the hash (an int) at once.
# A ReduceOp that carries more than its type (PREMUL_SUM's factor) is never kept.
_our_ops: dict[Any, OurOp] = {}
_by_reduce_op: dict[int, OurOp] = {}
_RED_OP_TYPE = tdist.ReduceOp.RedOpType
_REDUCE_OP = tdist.ReduceOp
_PLAIN_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def _hash_is_type() -> bool:
    """Whether a ReduceOp's hash is its RedOpType's value on this torch build (what keying
    _by_reduce_op by the hash relies on)."""
    try:
        types = [getattr(_RED_OP_TYPE, name) for name in _PLAIN_OPS]
        return all(hash(_REDUCE_OP(t)) == int(t) for t in types)
    except Exception:  # noqa: BLE001 - any surprise: no short way for ops
        return False


_HASH_IS_TYPE = _hash_is_type()
_KEPT_TYPES = (
    frozenset(int(getattr(_RED_OP_TYPE, name)) for name in _PLAIN_OPS)
    if _HASH_IS_TYPE
    else frozenset()
)


def op_of(x: Any) -> OurOp:
    """Our ReduceOp for an options struct, a ReduceOp, a RedOpType, or None (SUM); torch's
    are translated once each."""
    if x is None:
        return OurOp.SUM
    if hasattr(x, "reduceOp"):
        x = x.reduceOp
    op = getattr(x, "op", x)  # a ReduceOp object wraps its RedOpType
    mine = _our_ops.get(op) if type(op) is _RED_OP_TYPE else None
    if mine is None:
        if getattr(op, "name", "") == "PREMUL_SUM":
            raise UsageError(
                "PREMUL_SUM is NCCL-only; the pycollective backend does not support it"
            )
        mine = to_reduce_op(op)
        if type(op) is _RED_OP_TYPE:
            _our_ops[op] = mine
    if type(x) is _REDUCE_OP and type(op) is _RED_OP_TYPE and int(op) in _KEPT_TYPES:
        _by_reduce_op[int(op)] = mine
    return mine


def known_op(opts: Any) -> OurOp | None:
    """The op of an options struct when it was translated before (one look-up, for the
    synchronous calls' short way), else None."""
    return _by_reduce_op.get(hash(opts.reduceOp))


def timeout_of(*given: Any) -> float | None:
    """A per-call timeout (seconds) from the first options struct or timedelta given;
    None when unset."""
    for x in given:
        if x is not None and hasattr(x, "timeout"):
            x = x.timeout
        if isinstance(x, datetime.timedelta):
            seconds = x.total_seconds()
            return seconds if seconds > 0 else None  # torch's "unset" is -1 ms
    return None


def root_of(x: Any, default: int = 0) -> int:
    """An int root, or an options struct's rootRank."""
    if x is None:
        return default
    if hasattr(x, "rootRank"):
        return int(x.rootRank)
    if isinstance(x, bool) or not isinstance(x, int):
        raise UsageError(f"root must be an int or an options struct, got {type(x).__name__}")
    return int(x)


def flat_tensors(x: Any) -> list[torch.Tensor]:
    """Every tensor in a tensor or a nest of lists of them."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in flat_tensors(item)]
    return []


def one_dtype(tensors: Sequence[torch.Tensor]) -> bool:
    return len({t.dtype for t in tensors}) == 1


def contiguous(tensors: Sequence[torch.Tensor]) -> bool:
    return all(t.is_contiguous() for t in tensors)


def paired(outputs: Sequence[Any], inputs: Sequence[Any]) -> list[tuple[Any, Any]]:
    if len(outputs) != len(inputs):
        raise UsageError(f"coalesced op: {len(outputs)} outputs but {len(inputs)} inputs")
    return list(zip(outputs, inputs, strict=True))


# ---------------------------------------------------------------------- synchronous or not


_WAITING_CALLERS = (
    "all_reduce", "broadcast", "reduce", "all_gather_single", "all_gather_into_tensor",
    "reduce_scatter_single", "reduce_scatter_tensor",
)  # fmt: skip


def _callers_that_wait_if_given_a_work() -> frozenset:
    """The code of torch's functions that call a group's method with `asyncOp` False and
    then wait on the work only if there is one (`elif work is not None: work.wait()`):
    torch's contract for a backend that finishes a call before it returns ("the backend
    has sync'ed at CPP level"). A method's short way called from one of them returns
    None: the caller then has no Work to wait on nor to drop. Read from torch's source,
    so a torch whose function waits on whatever it gets is left out (it gets a Work)."""
    found = set()
    for name in _WAITING_CALLERS:
        fn = getattr(tdist, name, None)
        try:
            fn = inspect.unwrap(fn)
            if "work is not None" in inspect.getsource(fn):
                found.add(fn.__code__)
        except (OSError, TypeError, AttributeError):  # no source, not a Python function
            continue
    return frozenset(found)


WAITS_ONLY_ON_A_WORK = _callers_that_wait_if_given_a_work()


_calls = threading.local()


def _options_with_async_flag() -> tuple[type, ...]:
    """torch's options structs that carry `asyncOp`."""
    found = []
    for name in dir(_c10d):
        cls = getattr(_c10d, name)
        if name.endswith("Options") and isinstance(cls, type):
            try:
                if hasattr(cls(), "asyncOp"):
                    found.append(cls)
            except Exception:  # noqa: BLE001, S112 - one that needs arguments: not a call's options
                continue
    return tuple(found)


_OPTIONS = _options_with_async_flag()


def asynchronous() -> bool:
    """Whether the call being issued runs asynchronously (see torch_call)."""
    return not getattr(_calls, "sync", False)


def synchronous_call(opts: Any, kind: type) -> bool:
    """Whether a call whose options are `opts` may take its method's short way: the
    options are `kind` (what torch's own functions pass), the caller waits at once
    (`asyncOp` False) and the profiler is off."""
    return type(opts) is kind and opts.asyncOp is False and not profiling()


def torch_call(
    title: str, arg: int = 0
) -> Callable[[Callable[..., tdist.Work]], Callable[..., tdist.Work]]:
    """What every collective method does around its body.

    - torch's functions set `asyncOp` in the options they pass: False means the caller
      waits at once, so the call runs synchronously in the caller's thread (no thread
      switches: a small synchronous all_reduce costs what our own API's does) and returns
      a completed Work. C++ callers (DDP's reducer) leave it True: asynchronous.
    - Errors are raised as torch's DistBackendError too (torch_error).
    - While torch's profiler records, the call is an asynchronous event named like gloo's
      ("pycollective:all_reduce") with the tensors of positional argument `arg` as its
      inputs (as gloo records them), ending when the operation completes.
    """

    def wrap(method: Callable[..., tdist.Work]) -> Callable[..., tdist.Work]:
        @functools.wraps(method)
        def run(self: Any, *args: Any, **kwargs: Any) -> tdist.Work:
            sync = False
            for a in (*args, *kwargs.values()):
                if isinstance(a, _OPTIONS) and a.asyncOp is False:
                    sync = True
                    break
            event = None
            if profiling():
                inputs = tuple(flat_tensors(args[arg])) if len(args) > arg else ()
                event = _RecordFunctionFast(f"{self._profile_name}:{title}", inputs, {})
                event.__enter__()
                sync = False  # the event must end on another thread: asynchronous
            _calls.sync = sync
            try:
                work = method(self, *args, **kwargs)
            except BaseException as exc:
                if event is not None:
                    event.__exit__(None, None, None)
                raise torch_error(exc) from None
            finally:
                _calls.sync = False
            if event is not None:
                work._end_event_on_delivery(event)
            return work

        return run

    return wrap
