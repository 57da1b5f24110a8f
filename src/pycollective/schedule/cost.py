"""The alpha-beta-gamma cost of schedules, and the selector that picks the cheapest.

Lockstep model: a round costs, maximised over ranks, alpha if the rank sends or receives
anything in it + beta * max(bytes it sends, bytes it receives) + gamma * bytes it reduces
(+ overhead per message beyond the first, max over sends/recvs; 0 by default).
A collective costs the sum of its rounds. The per-round numbers depend on the schedule's
element counts only, so they are computed once per (collective, algorithm, size, count)
as a "profile" and priced for any itemsize and CostParams.

Oversubscription: with more ranks than cores on a host (params.ranks_per_core > 1) the
ranks take turns on the CPUs, and a call takes at least the CPU work of every rank divided
by the cores, whatever its critical path. A call then costs

    max(lockstep time, ranks_per_core * mean over ranks of the rank's CPU work)

where a rank's work is call_cpu + msg_cpu * (messages sent and received) + byte_cpu *
(bytes sent and received) + gamma * bytes reduced. This is what makes few-message algorithms
(tree) win at 4 and 8 ranks on 2 cores although their critical path is longer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from . import _fold, chain
from ._registry import ALGORITHMS, build
from ._steps import Recv, Schedule, Send

# Per round: the (communicates, max(sent, received), reduced, extra messages) tuples that
# can be the maximum for some non-negative parameters (dominated ones dropped).
Profile = tuple[tuple[tuple[int, int, int, int], ...], ...]

# Up to this size predict() looks at every rank; above, at a structural sample.
EXACT_LIMIT = 64


@dataclass(frozen=True, slots=True)
class CostParams:
    """alpha: seconds per round in which a rank communicates; beta: seconds per byte on
    the wire; gamma: seconds per byte reduced; overhead: seconds per message beyond the
    first that a rank sends (or receives) in one round. The plain model (overhead 0)
    charges a rank talking to p-1 peers at once like one talking to one, which flatters
    naive all-reduce and linear gather/scatter for tiny messages.

    The CPU-work side (used only when ranks_per_core > 1): msg_cpu, CPU seconds a
    message costs each of its two ends; byte_cpu, CPU seconds per byte at each end
    (copies, syscalls; gamma is the CPU per byte reduced); call_cpu, CPU seconds of a
    call whatever its messages (Python, engine, buffers); ranks_per_core, ranks on a
    host per core they share (1 or less: each rank has a core, and only the lockstep
    time counts)."""

    alpha: float
    beta: float
    gamma: float
    overhead: float = 0.0
    msg_cpu: float = 0.0
    byte_cpu: float = 0.0
    call_cpu: float = 0.0
    ranks_per_core: float = 1.0

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "gamma", "overhead", "msg_cpu", "byte_cpu", "call_cpu"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"CostParams.{name} must be a finite number >= 0, got {v!r}")
        r = self.ranks_per_core
        if not (isinstance(r, int | float) and math.isfinite(r) and r > 0):
            raise ValueError(f"CostParams.ranks_per_core must be a finite number > 0, got {r!r}")

    @property
    def oversubscribed(self) -> bool:
        return self.ranks_per_core > 1


def _rank_rounds(schedule: Schedule) -> list[tuple[int, int, int, int]]:
    out = []
    for rnd in schedule.rounds:
        sent = recv = red = nsend = nrecv = 0
        for step in rnd:
            if isinstance(step, Send):
                nsend += 1
                sent += step.src.count
            elif isinstance(step, Recv):
                nrecv += 1
                recv += step.dst.count
                if step.reduce:
                    red += step.dst.count
        msgs = max(nsend, nrecv)
        out.append((1 if msgs else 0, max(sent, recv), red, max(msgs - 1, 0)))
    return out


def _pareto(
    rows: Iterable[tuple[int, int, int, int]],
) -> tuple[tuple[int, int, int, int], ...]:
    keep: list[tuple[int, int, int, int]] = []
    for t in sorted(set(rows), reverse=True):
        if not any(all(x >= y for x, y in zip(k, t, strict=True)) for k in keep):
            keep.append(t)
    return tuple(keep)


def profile_of(schedules: Sequence[Schedule]) -> Profile:
    """The cost profile of a set of schedules (all ranks, or a sample: then a lower bound)."""
    per_rank = [_rank_rounds(s) for s in schedules]
    nrounds = max((len(r) for r in per_rank), default=0)
    return tuple(_pareto(r[t] for r in per_rank if t < len(r)) for t in range(nrounds))


def price(prof: Profile, itemsize: int, params: CostParams) -> float:
    """Seconds for a profile at this element size and these parameters."""
    a, b, g, o = params.alpha, params.beta * itemsize, params.gamma * itemsize, params.overhead
    return sum(
        max((c * a + n * b + r * g + m * o for c, n, r, m in rnd), default=0.0) for rnd in prof
    )


def schedule_cost(schedules: Sequence[Schedule], itemsize: int, params: CostParams) -> float:
    """Seconds for the given schedules (normally every rank's) under the lockstep model."""
    return price(profile_of(schedules), itemsize, params)


def sample_ranks(size: int, root: int = 0) -> list[int]:
    """Ranks whose schedules decide the cost of the algorithms here, for large worlds.

    Neighbourhoods of the root, of rank 0, of the fold boundary and of the end, plus the
    ranks at power-of-two distances from 0 and from the root (the binomial trees' busiest
    and the halving/doubling partners). Costs are maxima over ranks, so a sample gives a
    lower bound; for these algorithms it is exact or off by one element per message.
    """
    picks: set[int] = set()
    rem2 = 2 * _fold.extras(size)
    for base in (0, root, rem2, size // 2, size - 1):
        for d in range(-2, 3):
            picks.add((base + d) % size)
    k = 1
    while k < size:
        for base in (0, root):
            for x in (k - 1, k, k + 1):
                picks.add((base + x) % size)
                picks.add((base - x) % size)
        k <<= 1
    return sorted(picks)


# Algorithms whose every rank does the same thing up to a rotation of ranks, with equal
# message sizes: rank 0 alone gives the exact profile.
_SHIFT_SYMMETRIC = {
    ("all_gather", "ring"),
    ("reduce_scatter", "ring"),
    ("all_to_all", "pairwise"),
    ("barrier", "dissemination"),
}


def _fast_profile(
    collective: str, algorithm: str, size: int, count: int, root: int, segment: int
) -> Profile | None:
    """Exact profiles for large worlds without building every rank, where a rank sample
    would miss rounds or larger blocks; None where sample_ranks() is exact."""
    if (collective, algorithm) in _SHIFT_SYMMETRIC:
        return profile_of([build(collective, algorithm, 0, size, count, root, segment)])
    if (collective, algorithm) == ("all_reduce", "ring"):
        # Every round moves every block once, so the largest block sets each round.
        big = -(-count // size)
        if big == 0 or size == 1:
            return ()
        return (((1, big, big, 0),),) * (size - 1) + (((1, big, 0, 0),),) * (size - 1)
    if (collective, algorithm) == ("broadcast", "chain"):
        # Round t carries the segments s with t - s a hop 0..size-2.
        seg = segment if segment > 0 else chain.default_segment(count)
        nseg = -(-count // seg)
        if nseg == 0 or size == 1:
            return ()
        sizes = [min(seg, count - s * seg) for s in range(nseg)]
        return tuple(
            ((1, max(sizes[max(0, t - size + 2) : t + 1]), 0, 0),) for t in range(nseg + size - 2)
        )
    return None


@lru_cache(maxsize=4096)
def profile(
    collective: str,
    algorithm: str,
    size: int,
    count: int,
    root: int = 0,
    segment: int = 0,
    exact_limit: int = EXACT_LIMIT,
) -> Profile:
    """The cached profile of one configuration: from every rank when size <= exact_limit;
    above, in closed form or from rank 0 where the algorithm allows, else from
    sample_ranks() only (so a 4096-rank prediction builds at most ~100 schedules)."""
    if size > exact_limit:
        fast = _fast_profile(collective, algorithm, size, count, root, segment)
        if fast is not None:
            return fast
    ranks = range(size) if size <= exact_limit else sample_ranks(size, root)
    return profile_of([build(collective, algorithm, r, size, count, root, segment) for r in ranks])


# Mean over ranks of (messages sent + received, elements sent + received, elements reduced).
Work = tuple[float, float, float]


def work_of(schedules: Sequence[Schedule]) -> Work:
    """The mean CPU-work counts of a set of schedules (every rank's, or a sample)."""
    if not schedules:
        return (0.0, 0.0, 0.0)
    msgs = elems = red = 0
    for sched in schedules:
        for step in sched.steps():
            if isinstance(step, Send):
                msgs += 1
                elems += step.src.count
            elif isinstance(step, Recv):
                msgs += 1
                elems += step.dst.count
                red += step.dst.count if step.reduce else 0
    n = len(schedules)
    return (msgs / n, elems / n, red / n)


@lru_cache(maxsize=4096)
def work(
    collective: str,
    algorithm: str,
    size: int,
    count: int,
    segment: int = 0,
    exact_limit: int = EXACT_LIMIT,
) -> Work:
    """The cached work counts of one configuration (root 0): from every rank up to
    exact_limit ranks; above, in closed form, from rank 0 or from sample_ranks()."""
    if size > exact_limit:
        if (collective, algorithm) == ("all_reduce", "ring"):
            # Every rank sends and receives 2(p-1) blocks of about count/p; p-1 reduced.
            return (4.0 * (size - 1), 4.0 * (size - 1) * count / size, (size - 1) * count / size)
        if (collective, algorithm) in _SHIFT_SYMMETRIC:
            return work_of([build(collective, algorithm, 0, size, count, 0, segment)])
    ranks = range(size) if size <= exact_limit else sample_ranks(size, 0)
    return work_of([build(collective, algorithm, r, size, count, 0, segment) for r in ranks])


def price_work(w: Work, itemsize: int, params: CostParams) -> float:
    """Seconds the CPUs need for a call's work when ranks share them: ranks_per_core times
    one rank's mean work (the total over a host's ranks divided by its cores)."""
    msgs, elems, red = w
    per_rank = params.call_cpu + params.msg_cpu * msgs
    per_rank += (params.byte_cpu * elems + params.gamma * red) * itemsize
    return params.ranks_per_core * per_rank


def predict(
    collective: str,
    algorithm: str,
    size: int,
    count: int,
    itemsize: int,
    params: CostParams,
    root: int = 0,
    segment: int = 0,
) -> float:
    """Predicted seconds for one collective call (count elements of itemsize bytes).

    Every algorithm here is built on ranks relative to the root, so the cost does not
    depend on which rank is root: it is priced for root 0 and shares the cache. With
    params.ranks_per_core > 1 it is the larger of the lockstep time and the CPU work.
    """
    if not 0 <= root < max(size, 1):
        raise ValueError(f"root {root} out of range for size {size}")
    t = price(profile(collective, algorithm, size, count, 0, segment), itemsize, params)
    if params.oversubscribed:
        t = max(t, price_work(work(collective, algorithm, size, count, segment), itemsize, params))
    return t


def select(
    collective: str,
    size: int,
    count: int,
    itemsize: int,
    params: CostParams,
    root: int = 0,
    candidates: Sequence[str] | None = None,
    segment: int = 0,
) -> str:
    """The cheapest algorithm for this call; ties go to the one with the shorter lockstep
    time when ranks share cores, then to the earlier one in ALGORITHMS. `segment` is what
    chain broadcast will be built with (0 = its default)."""
    if collective not in ALGORITHMS:
        raise ValueError(f"unknown collective {collective!r}")
    known = ALGORITHMS[collective]
    names = known if candidates is None else tuple(candidates)
    if not names:
        raise ValueError("no candidate algorithms")
    unknown = [a for a in names if a not in known]
    if unknown:
        raise ValueError(f"unknown algorithm(s) {unknown} for {collective}; known: {known}")
    ordered = [a for a in known if a in names]
    costs = [predict(collective, a, size, count, itemsize, params, root, segment) for a in ordered]
    if params.oversubscribed:
        # Equal CPU work (e.g. one element: most blocks empty): the shorter critical path.
        lock = [price(profile(collective, a, size, count, 0, segment), itemsize, params)
                for a in ordered]  # fmt: skip
        keys = list(zip(costs, lock, strict=True))
        return ordered[keys.index(min(keys))]
    return ordered[costs.index(min(costs))]


def formula(collective: str, algorithm: str, size: int, nbytes: float, params: CostParams) -> float:
    """Closed-form cost (docs/cost_model.md) for all_reduce by ring, recursive_doubling,
    halving_doubling, tree or naive, with p ranks and n bytes per rank.

    Exact against schedule_cost when n splits evenly into the blocks. For p not a power
    of two, recursive doubling and halving-doubling add the fold (alpha + n beta +
    n gamma) and the unfold (alpha + n beta) around a core of the largest power of two.
    params.overhead is not part of these forms (naive's rank 0 would add 2(p-2) of it).
    """
    if collective != "all_reduce":
        raise ValueError(f"no closed form for {collective}")
    a, b, g = params.alpha, params.beta, params.gamma
    p, n = size, nbytes
    if p < 1:
        raise ValueError(f"size must be >= 1, got {p}")
    p2 = _fold.core_size(p)
    lg = p2.bit_length() - 1
    fold = (2 * a + 2 * n * b + n * g) if p != p2 else 0.0
    if algorithm == "ring":
        return 2 * (p - 1) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * g
    if algorithm == "recursive_doubling":
        return lg * (a + n * b + n * g) + fold
    if algorithm == "halving_doubling":
        return 2 * lg * a + 2 * (p2 - 1) / p2 * n * b + (p2 - 1) / p2 * n * g + fold
    if algorithm == "tree":
        L = (p - 1).bit_length()
        return 2 * L * (a + n * b) + L * n * g
    if algorithm == "naive":
        return (2 * a + 2 * (p - 1) * n * b + (p - 1) * n * g) if p > 1 else 0.0
    raise ValueError(f"no closed form for all_reduce {algorithm!r}")


__all__ = [
    "EXACT_LIMIT",
    "CostParams",
    "Profile",
    "Work",
    "formula",
    "predict",
    "price",
    "price_work",
    "profile",
    "profile_of",
    "sample_ranks",
    "schedule_cost",
    "select",
    "work",
    "work_of",
]
