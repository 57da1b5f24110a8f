"""One synchronous parameter-server step as a schedule: W workers push their gradients to
S servers, each server sums its slice, and every worker pulls the slices back.

This is the step `pycollective.ps` runs (sync mode), written as data so that the cost
model prices it like any collective and `simulate` can check it: ranks 0..W-1 are the
workers, W..W+S-1 the servers (one per host, as `pycollective run --servers` places
them). The parameter vector of `count` elements is cut into S contiguous slices whose
sizes differ by at most one element, the first `count % S` one longer (ps/_sharding.py's
rule).

Two rounds. Push: every worker sends slice s to server s (S messages of ~n/S); server s
receives W of them and adds them up (W messages, W n/S elements reduced). Pull: server s
sends its slice to every worker; each worker receives S slices, which cover its vector.
Under the lockstep model of cost.py a round costs, at its busiest rank,

    alpha + beta x max(n, W n / S) + gamma x (W n / S on a server) + overhead x (extra messages)

so the step costs about 2 alpha + 2 beta n max(1, W/S): the servers' links carry W/S
times what a worker's link does, where ring all-reduce carries 2(W-1)/W n on every link.

Buffers: a worker has {"data": n} (its gradient in, the sum out); a server has {"data":
its slice}, which must start at zero (the server's accumulator: every push is added in).
The optimizer's update on the servers is not part of the schedule.
"""

from __future__ import annotations

from ._steps import Chunk, Recv, Round, Schedule, Send

ALGORITHM = "parameter_server"


def slices(count: int, servers: int) -> list[tuple[int, int]]:
    """[(offset, length)] of each server's slice of `count` elements."""
    base, extra = divmod(count, servers)
    out, start = [], 0
    for s in range(servers):
        n = base + (1 if s < extra else 0)
        out.append((start, n))
        start += n
    return out


def _check(workers: int, servers: int, count: int) -> None:
    for name, v, low in (("workers", workers, 1), ("servers", servers, 1), ("count", count, 0)):
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ValueError(f"parameter-server step: {name} must be an int >= {low}, got {v!r}")


def build(rank: int, workers: int, servers: int, count: int) -> Schedule:
    """Rank `rank`'s schedule of one step (workers 0..W-1, servers W..W+S-1)."""
    _check(workers, servers, count)
    size = workers + servers
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} out of range for {workers} workers + {servers} servers")
    parts = slices(count, servers)
    push: Round
    pull: Round
    if rank < workers:
        push = tuple(
            Send(workers + s, Chunk("data", off, n)) for s, (off, n) in enumerate(parts) if n
        )
        pull = tuple(
            Recv(workers + s, Chunk("data", off, n)) for s, (off, n) in enumerate(parts) if n
        )
        return Schedule(rank, size, (push, pull), buffers={"data": count})
    _, n = parts[rank - workers]
    if not n:
        return Schedule(rank, size, ((), ()), buffers={"data": 0})
    push = tuple(Recv(w, Chunk("data", 0, n), reduce=True) for w in range(workers))
    pull = tuple(Send(w, Chunk("data", 0, n)) for w in range(workers))
    return Schedule(rank, size, (push, pull), buffers={"data": n})


def build_all(workers: int, servers: int, count: int) -> list[Schedule]:
    return [build(r, workers, servers, count) for r in range(workers + servers)]


def sample(workers: int, servers: int, count: int) -> list[Schedule]:
    """The schedules that decide the cost: every worker is alike, and server 0 holds the
    longest slice, so worker 0 and server 0 price the step exactly."""
    return [build(0, workers, servers, count), build(workers, workers, servers, count)]


__all__ = ["ALGORITHM", "build", "build_all", "sample", "slices"]
