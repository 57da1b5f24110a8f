"""What the backend's helper modules (_coalesced.py, _p2p.py) use of the torch backend's
process group, as a protocol: they take the group as an argument and so need not import
_backend.py, which imports them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch.distributed as tdist

import torch

from ..core.group import ProcessGroup
from ..core.work import Work


class BackendGroup(Protocol):
    """The torch backend's group (_backend.PycollectiveProcessGroup) as its helpers see it."""

    _pg: ProcessGroup  # our group of the same ranks

    def rank(self) -> int: ...

    def size(self) -> int: ...

    def _work(
        self,
        works: Sequence[Work | None],
        finish: Callable[[], None] | None,
        result: Any,
        timeout: float | None = None,
    ) -> tdist.Work: ...

    def _allgather_list(self, outs: list[torch.Tensor], inp: torch.Tensor) -> Any: ...

    def _allgather_flat(self, output: torch.Tensor, input: torch.Tensor) -> Any: ...

    def _reduce_scatter_flat(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any: ...
