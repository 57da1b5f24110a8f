"""The rank side of compare_peers.py: pycollective, gloo and OpenMPI in the same processes.

Started by compare_peers.py as N ranks, under OpenMPI's mpirun when it is there (then
OpenMPI runs beside the others) or else under `pycollective run`, with a JSON spec in argv.
The measuring is `pycollective bench`'s own (pycollective.cli.bench_worker): the backends take
turns repetition by repetition, each repetition is a batch of calls lasting about 2 ms timed
as the slowest rank's, and the median repetition is reported. This file adds only the
OpenMPI backend (mpi4py on numpy arrays) and the spec's per-collective sizes.
Rank 0 prints "BENCH {json}" per measurement and "META {json}" once.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import _deepspeed
import numpy as np

from pycollective.cli import bench_worker as bw


class Mpi:
    """OpenMPI through mpi4py on numpy buffers; all_reduce both out of place and in place
    (MPI_IN_PLACE), the other collectives as their usual calls."""

    name = "openmpi"

    def __init__(self, transport: str, spec: dict) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def library(self) -> str:
        return self.MPI.Get_library_version().split(",")[0].strip()

    def algorithms(self, collective: str, wanted: list[str]) -> list[str]:
        return ["in_place", "out_of_place"] if collective == "all_reduce" else ["out_of_place"]

    def chosen(self, collective: str, algorithm: str, count: int, dtype: str) -> str:
        return algorithm

    def call(self, collective: str, algorithm: str, count: int, dtype: str) -> Callable[[], Any]:
        c, p, mpi = self.comm, self.size, self.MPI
        if collective == "all_reduce":
            x = np.ones(count, dtype)
            if algorithm == "in_place":
                return lambda: c.Allreduce(mpi.IN_PLACE, x, op=mpi.SUM)
            out = np.empty_like(x)
            return lambda: c.Allreduce(x, out, op=mpi.SUM)
        if collective == "broadcast":
            x = np.ones(count, dtype)
            return lambda: c.Bcast(x, root=0)
        if collective == "all_gather":
            x, out = np.full(count, self.rank, dtype), np.empty(count * p, dtype)
            return lambda: c.Allgather(x, out)
        if collective == "reduce_scatter":
            x, out = np.ones(count * p, dtype), np.empty(count, dtype)
            return lambda: c.Reduce_scatter_block(x, out, op=mpi.SUM)
        raise SystemExit(f"compare_peers: no OpenMPI call for {collective}")

    def max(self, values: np.ndarray) -> np.ndarray:
        self.comm.Allreduce(self.MPI.IN_PLACE, values, op=self.MPI.MAX)
        return values

    def barrier(self) -> None:
        self.comm.Barrier()

    def close(self) -> None:
        pass  # mpi4py finalizes at exit


class OursShared(bw._Ours):
    """pycollective's all_reduce on buffers from `pycollective.empty` (shared memory):
    every rank's buffer is one, so the arena reduces straight from the peers' buffers
    instead of copying through its slots (as an MPI user allocates with MPI_Alloc_mem).
    all_reduce only: the other collectives copy through the arena either way."""

    def algorithms(self, collective: str, wanted: list[str]) -> list[str]:
        return super().algorithms(collective, wanted) if collective == "all_reduce" else []

    def empty(self, n: int, dtype: str) -> Any:
        buf = self.dist.empty(n, bw.numpy_dtype(dtype))
        buf[:] = 0
        return buf


def make_backend(name: str, spec: dict) -> Any:
    if name == "shm_shared":
        return OursShared(name, spec)
    if name == "openmpi":
        return Mpi(name, spec)
    if name == "deepspeed":  # only in the DeepSpeed venv's Python (compare_peers.py)
        return _deepspeed.DeepSpeed(name, spec)
    if name == "gloo":
        return bw._Gloo(name, spec)
    # "shm" (the default group, shared memory), "tcp", or "auto" (the default group,
    # whatever it runs on: across hosts TCP between them and shared memory inside one)
    return bw._Ours(name, spec)


def _rank_env_from_mpirun() -> None:
    """gloo's set-up reads RANK and WORLD_SIZE: give them mpirun's numbers."""
    ompi = {
        "RANK": "OMPI_COMM_WORLD_RANK",
        "WORLD_SIZE": "OMPI_COMM_WORLD_SIZE",
        "LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_RANK",
        "LOCAL_WORLD_SIZE": "OMPI_COMM_WORLD_LOCAL_SIZE",
    }
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
        for ours, theirs in ompi.items():
            os.environ[ours] = os.environ[theirs]


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    _rank_env_from_mpirun()
    backends: dict[str, Any] = {}
    try:
        for name in spec["backends"]:
            backends[name] = make_backend(name, spec)
        first = next(iter(backends.values()))
        if first.rank == 0:
            meta = {"transport_env": os.environ.get("PYCOLLECTIVE_TRANSPORT", "auto")}
            if "openmpi" in backends:
                meta["mpi_library"] = backends["openmpi"].library()
            if "deepspeed" in backends:
                meta["deepspeed"] = backends["deepspeed"].library()
            print("META " + json.dumps(meta), flush=True)
        for collective, sizes in spec["plan"]:
            bw.run(backends, dict(spec, collectives=[collective], sizes=sizes))
    finally:
        for b in reversed(list(backends.values())):
            b.close()
    if "deepspeed" in backends:  # only once all went well: an error keeps its exit status
        _exit_past_torch_threads()
    return 0


def _exit_past_torch_threads() -> None:
    """End the process without the interpreter's finalization. In DeepSpeed's venv (its
    own torch) a gloo worker thread sometimes drops its last tensor reference while the
    interpreter finalizes, takes the GIL from a dying thread and aborts the rank (signal 6
    in ProcessGroupGloo::runLoop), after every number was printed. MPI is finalized first
    (mpirun counts a rank that skipped it as failed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
