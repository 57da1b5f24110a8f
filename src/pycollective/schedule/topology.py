"""A two-level cost model: H hosts of L ranks each, a fast link inside a host and a slower
one between hosts, and what flat and hierarchical all-reduce cost on it.

Ranks are placed in blocks, as launchers place them: rank r is on host r // L. Each host
has one network link (its NIC): the ranks of a host that send to other hosts in the same
round share it. A round of a flat schedule costs the larger of

* per rank: alpha of the slowest link it uses (inter if it talks to another host, else
  intra) + max(intra bytes x intra beta, inter bytes x inter beta) (the two links run
  side by side; bytes are max(sent, received) per link) + bytes reduced x gamma
  + overhead x (messages beyond the first);
* per host: inter alpha + inter beta x max(bytes its ranks send to other hosts, bytes
  they receive from them) (the shared NIC).

So a flat ring in rank order crosses each host's NIC with one flow (the edge from its
last rank to the next host's first) and costs about 2(p-1) inter alphas + 2 n inter
beta, while halving-doubling's first rounds pair ranks p/2 apart: all L ranks of a host
send n/2, n/4, ... across the NIC at once, L times the ring's load.

The hierarchical all-reduce (_hierarchy.py) is priced from its three steps with the
single-level model of cost.py: reduce-scatter and all-gather by ring among L ranks with
the intra parameters, and the cheapest flat all-reduce among H ranks of n/L elements with
the inter parameters, its beta multiplied by L because the L per-local-index all-reduces
of a host run at once over its one NIC.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from . import cost
from ._registry import ALGORITHMS, build
from ._steps import Recv, Schedule, Send, Step

HIERARCHICAL = "hierarchical"

# Per round: (rank rows, largest NIC load). A rank row is (level, intra elements, inter
# elements, elements reduced, extra messages) with level 0 silent, 1 intra only, 2 inter.
TopoRound = tuple[tuple[tuple[int, int, int, int, int], ...], int]
TopoProfile = tuple[TopoRound, ...]


@dataclass(frozen=True)
class Topology:
    """`hosts` x `ranks_per_host` ranks; `intra` prices a host's internal link (shared
    memory), `inter` the network between hosts (per host NIC)."""

    hosts: int
    ranks_per_host: int
    intra: cost.CostParams
    inter: cost.CostParams

    def __post_init__(self) -> None:
        for name in ("hosts", "ranks_per_host"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Topology.{name} must be an int >= 1, got {v!r}")

    @property
    def size(self) -> int:
        return self.hosts * self.ranks_per_host

    def host_of(self, rank: int) -> int:
        return rank // self.ranks_per_host


def _classify(
    schedules: dict[int, Schedule], L: int
) -> tuple[list[list[tuple[int, int, int, int, int]]], list[dict[int, list[int]]]]:
    """Per rank and round, its row; per round, per host, [inter sent, inter received]."""
    nrounds = max((len(s.rounds) for s in schedules.values()), default=0)
    rows: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(nrounds)]
    nic: list[dict[int, list[int]]] = [{} for _ in range(nrounds)]
    for rank, sched in schedules.items():
        host = rank // L
        for t, rnd in enumerate(sched.rounds):
            si = ri = se = re = red = ns = nr = 0
            for step in rnd:
                if isinstance(step, Send):
                    ns += 1
                    if step.peer // L == host:
                        si += step.src.count
                    else:
                        se += step.src.count
                elif isinstance(step, Recv):
                    nr += 1
                    if step.peer // L == host:
                        ri += step.dst.count
                    else:
                        re += step.dst.count
                    if step.reduce:
                        red += step.dst.count
            msgs = max(ns, nr)
            if not msgs:
                continue
            level = 2 if se or re or _crosses(rnd, host, L) else 1
            rows[t].append((level, max(si, ri), max(se, re), red, msgs - 1))
            if se or re:
                load = nic[t].setdefault(host, [0, 0])
                load[0] += se
                load[1] += re
    return rows, nic


def _crosses(rnd: Sequence[Step], host: int, L: int) -> bool:
    """Zero-byte messages to another host still pay the inter alpha."""
    return any(isinstance(s, Send | Recv) and s.peer // L != host for s in rnd)


def _sample_hosts(H: int, L: int) -> list[int]:
    """Hosts whose ranks decide the cost: every host up to cost.EXACT_LIMIT ranks, else the
    hosts of cost.sample_ranks() (neighbourhoods and power-of-two distances)."""
    if H * L <= cost.EXACT_LIMIT:
        return list(range(H))
    return sorted({r // L for r in cost.sample_ranks(H * L)})


@lru_cache(maxsize=1024)
def flat_profile(
    collective: str, algorithm: str, hosts: int, ranks_per_host: int, count: int
) -> TopoProfile:
    """The two-level profile of a flat algorithm on hosts x ranks_per_host (root 0)."""
    H, L = hosts, ranks_per_host
    p = H * L
    if (collective, algorithm) == ("all_reduce", "ring") and p > cost.EXACT_LIMIT:
        return _ring_profile(H, L, count)
    ranks = [h * L + i for h in _sample_hosts(H, L) for i in range(L)]
    scheds = {r: build(collective, algorithm, r, p, count) for r in ranks}
    rows, nic = _classify(scheds, L)
    out = []
    for t in range(len(rows)):
        load = max((max(v) for v in nic[t].values()), default=0)
        out.append((tuple(sorted(set(rows[t]))), load))
    return tuple(out)


def _ring_profile(H: int, L: int, count: int) -> TopoProfile:
    """Closed form for the flat ring (every round moves every block once along r -> r+1;
    the edge from a host's last rank to the next host's first is its only NIC flow)."""
    p = H * L
    big = -(-count // p)
    if big == 0 or p == 1:
        return ()
    rounds = []
    for red in (big, 0):
        rows = set()
        if L > 1:
            rows.add((1, big, 0, red, 0))
        if H > 1:
            rows.add((2, big if L > 1 else 0, big, red, 0))
        rnd = (tuple(sorted(rows)), big if H > 1 else 0)
        rounds += [rnd] * (p - 1)
    return tuple(rounds)


def price_flat(prof: TopoProfile, itemsize: int, topo: Topology) -> float:
    i, e = topo.intra, topo.inter
    bi, be, g = i.beta * itemsize, e.beta * itemsize, i.gamma * itemsize
    total = 0.0
    for rows, load in prof:
        worst = e.alpha + load * be if load else 0.0
        for level, ni, ne, red, extra in rows:
            params = e if level == 2 else i
            t = params.alpha + max(ni * bi, ne * be) + red * g + extra * params.overhead
            worst = max(worst, t)
        total += worst
    return total


@dataclass(frozen=True)
class HierarchicalCost:
    total: float
    reduce_scatter: float  # inside each host
    cross: float  # across hosts
    all_gather: float  # inside each host
    cross_algorithm: str


def hierarchical(count: int, itemsize: int, topo: Topology) -> HierarchicalCost:
    """Seconds for the hierarchical all-reduce of `count` elements, by step."""
    H, L = topo.hosts, topo.ranks_per_host
    if count == 0:
        return HierarchicalCost(0.0, 0.0, 0.0, 0.0, "-")
    b = -(-count // L) if L > 1 else count
    rs = cost.predict("reduce_scatter", "ring", L, b, itemsize, topo.intra) if L > 1 else 0.0
    ag = cost.predict("all_gather", "ring", L, b, itemsize, topo.intra) if L > 1 else 0.0
    cross, algo = 0.0, "-"
    if H > 1:
        shared = dataclasses.replace(topo.inter, beta=topo.inter.beta * L)
        cross, algo = min(
            (cost.predict("all_reduce", a, H, b, itemsize, shared), a)
            for a in ALGORITHMS["all_reduce"]
        )
    return HierarchicalCost(rs + cross + ag, rs, cross, ag, algo)


def predict(algorithm: str, count: int, itemsize: int, topo: Topology) -> float:
    """Predicted seconds for one all_reduce of `count` elements by `algorithm` (a flat
    one from schedule.ALGORITHMS, or "hierarchical") on `topo`."""
    if algorithm == HIERARCHICAL:
        return hierarchical(count, itemsize, topo).total
    if algorithm not in ALGORITHMS["all_reduce"]:
        known = ", ".join((*ALGORITHMS["all_reduce"], HIERARCHICAL))
        raise ValueError(f"unknown all_reduce algorithm {algorithm!r}; known: {known}")
    prof = flat_profile("all_reduce", algorithm, topo.hosts, topo.ranks_per_host, count)
    return price_flat(prof, itemsize, topo)


def select(
    count: int, itemsize: int, topo: Topology, candidates: Sequence[str] | None = None
) -> str:
    """The cheapest all_reduce algorithm on `topo` (ties: flat ones first, in order)."""
    names = (
        list(candidates) if candidates is not None else [*ALGORITHMS["all_reduce"], HIERARCHICAL]
    )
    if not names:
        raise ValueError("no candidate algorithms")
    costs = [predict(a, count, itemsize, topo) for a in names]
    return names[costs.index(min(costs))]


__all__ = [
    "HIERARCHICAL",
    "HierarchicalCost",
    "Topology",
    "flat_profile",
    "hierarchical",
    "predict",
    "price_flat",
    "select",
]
