"""Measure the cost-model parameters (alpha, beta, gamma, overhead) of the TCP transport.

    python benchmarks/calibrate.py -n 4 [--json out.json]
    python -m pycollective run -n 4 benchmarks/calibrate.py [--json out.json]

Everything goes through the library's public API, so the numbers include our Python
overheads (engine, executor, header packing, the selector loop), which is what
`auto` has to model. All values are medians over repetitions.

alpha     one-message latency: ping-pong of one float32 between ranks 0 and 1, half the
          round trip (send/recv).
alpha_round
          what one more round of a collective costs: tiny (one float32) all_reduce with
          every algorithm, least-squares slope of time against the schedule's number of
          rounds (all ranks take part, so on an oversubscribed machine this includes the
          scheduler waking the ranks in turn). This is the alpha auto should use.
beta      seconds per byte: slope of the time of a simultaneous exchange (ranks 0 and 1
          each isend + irecv, as in a ring step) over 1, 4 and 16 MiB.
gamma     seconds per byte of reduction: np.add(a, b, out=a) on float32 arrays of 16 MiB
          (beyond cache) and, for comparison, in the executor's 512 KiB segments.
overhead  each extra message of a round: rank 0 sends one float32 to each of k peers and
          waits for their replies, in one batch; (t(p-1 peers) - t(1 peer)) / (2 (p-2)).
          Needs p >= 3.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench  # noqa: E402


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--nprocs", type=int, default=4, help="ranks when run by hand")
    ap.add_argument("--json", help="write the parameters to this file (rank 0)")
    ap.add_argument("--reps", type=int, default=400, help="ping-pongs for alpha")
    ap.add_argument("--timeout", type=float, default=300.0)
    return ap.parse_args(argv)


def _pingpong(dist, buf: np.ndarray, reps: int, peer: int) -> list[float]:
    """Rank 0 <-> peer: per-iteration round-trip times on rank 0 (others return [])."""
    rank = dist.get_rank()
    out = []
    for _ in range(reps):
        if rank == 0:
            t0 = time.perf_counter()
            dist.send(buf, dst=peer)
            dist.recv(buf, src=peer)
            out.append(time.perf_counter() - t0)
        elif rank == peer:
            dist.recv(buf, src=0)
            dist.send(buf, dst=0)
    return out


def _exchange(dist, sbuf: np.ndarray, rbuf: np.ndarray, reps: int) -> list[float]:
    """Ranks 0 and 1 exchange buffers at once; per-rep time on rank 0 after a barrier."""
    rank = dist.get_rank()
    out = []
    for _ in range(reps):
        dist.barrier()
        if rank > 1:
            continue
        peer = 1 - rank
        t0 = time.perf_counter()
        ops = [dist.P2POp(dist.irecv, rbuf, peer), dist.P2POp(dist.isend, sbuf, peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        out.append(time.perf_counter() - t0)
    return out


def _fanout(dist, peers: int, reps: int) -> list[float]:
    """Rank 0 sends a float32 to ranks 1..peers and receives one back from each, as one
    batch; times on rank 0."""
    rank = dist.get_rank()
    buf = np.zeros(1, dtype=np.float32)
    bufs = [np.zeros(1, dtype=np.float32) for _ in range(peers)]
    out = []
    for _ in range(reps):
        if rank == 0:
            t0 = time.perf_counter()
            ops = [dist.P2POp(dist.isend, buf, r) for r in range(1, peers + 1)]
            ops += [dist.P2POp(dist.irecv, bufs[r - 1], r) for r in range(1, peers + 1)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            out.append(time.perf_counter() - t0)
        elif rank <= peers:
            dist.recv(buf, src=0)
            dist.send(buf, dst=0)
    dist.barrier()
    return out


def _gamma(nbytes: int, segment: int | None, reps: int = 15) -> float:
    n = nbytes // 4
    a = np.ones(n, dtype=np.float32)
    b = np.ones(n, dtype=np.float32)
    seg = n if segment is None else segment // 4
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for lo in range(0, n, seg):
            np.add(a[lo : lo + seg], b[lo : lo + seg], out=a[lo : lo + seg])
        times.append(time.perf_counter() - t0)
    return _bench.median(times) / nbytes


def _shape(collective: str, algorithm: str, p: int) -> tuple[int, int]:
    """(rounds in which some rank communicates, sum over rounds of the most extra messages
    a rank has) for one element: what alpha and overhead multiply in the cost model."""
    from pycollective.schedule import cost

    prof = cost.profile(collective, algorithm, p, 1)
    rounds = sum(1 for rnd in prof if any(c for c, *_ in rnd))
    extra = sum(max((m for *_, m in rnd), default=0) for rnd in prof)
    return rounds, extra


def run() -> dict:
    import pycollective as dist
    from pycollective.schedule import ALGORITHMS

    args = _parse()
    dist.init_process_group()
    rank, p = dist.get_rank(), dist.get_world_size()
    res: dict = {"world_size": p}

    # alpha: one-float ping-pong, half the round trip.
    tiny = np.zeros(1, dtype=np.float32)
    _pingpong(dist, tiny, 20, 1)
    rt = _pingpong(dist, tiny, args.reps, 1)
    if rank == 0:
        res["alpha"] = _bench.median(rt) / 2

    # alpha_round (and overhead from collectives): tiny all_reduce with every algorithm,
    # taking turns; time = per_call + alpha_round * rounds + overhead * extra messages.
    buf = np.zeros(1, dtype=np.float32)
    fns = {a: (lambda a=a: dist.all_reduce(buf, algorithm=a)) for a in ALGORITHMS["all_reduce"]}
    times = _bench.interleaved(dist, fns, args.reps // 4, 8.0, warmup=5)
    pts = [(a, *_shape("all_reduce", a, p), _bench.median(t)) for a, t in times.items()]
    res["tiny_all_reduce"] = {
        a: {"rounds": r, "extra_messages": m, "median_s": t} for a, r, m, t in pts
    }
    cols = [[1.0, r] + ([m] if p > 2 else []) for _, r, m, _ in pts]
    coef = np.linalg.lstsq(np.array(cols), np.array([t for *_, t in pts]), rcond=None)[0]
    res["per_call"], res["alpha_round"] = float(coef[0]), float(coef[1])
    if p > 2:
        res["overhead_round"] = float(coef[2])
    # beta: simultaneous exchange, slope over sizes.
    sizes = [1 << 20, 4 << 20, 16 << 20]
    ex = []
    for nb in sizes:
        s = np.ones(nb // 4, dtype=np.float32)
        r = np.empty_like(s)
        _exchange(dist, s, r, 2)
        ex.append(_bench.median(_exchange(dist, s, r, 9 if nb < (16 << 20) else 7)))
    # one-way for reference: ping-pong of 16 MiB
    big = np.ones((16 << 20) // 4, dtype=np.float32)
    one_way = _pingpong(dist, big, 7, 1)
    if rank == 0:
        slope_b, _ = np.polyfit(np.array(sizes, dtype=float), np.array(ex), 1)
        res["beta"] = float(slope_b)
        res["exchange_s"] = {str(nb): t for nb, t in zip(sizes, ex, strict=True)}
        res["beta_one_way"] = _bench.median(one_way) / 2 / (16 << 20)
        res["gamma"] = _gamma(16 << 20, None)
        res["gamma_segmented"] = _gamma(16 << 20, 512 * 1024)
    del big

    # overhead: fan-out to p-1 peers against fan-out to one.
    if p >= 3:
        _fanout(dist, 1, 20)
        one = _fanout(dist, 1, 300)
        _fanout(dist, p - 1, 20)
        many = _fanout(dist, p - 1, 300)
        if rank == 0:
            res["overhead"] = max(0.0, (_bench.median(many) - _bench.median(one)) / (2 * (p - 2)))
            res["fanout_1_s"] = _bench.median(one)
            res[f"fanout_{p - 1}_s"] = _bench.median(many)

    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        res["machine"] = f"{platform.machine()} {os.cpu_count()} cpus, {platform.python_version()}"
        res["date"] = time.strftime("%Y-%m-%d")
        _report(res)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=2)
    return res


def _report(res: dict) -> None:
    p = res["world_size"]
    print(f"calibration, TCP on loopback, {p} ranks ({res['machine']})")
    print(f"  alpha       {res['alpha'] * 1e6:9.1f} us   (half a one-float send/recv round trip)")
    print(f"  alpha_round {res['alpha_round'] * 1e6:9.1f} us   (tiny all_reduce, per round)")
    print(f"  per_call    {res['per_call'] * 1e6:9.1f} us   (tiny all_reduce, fixed part)")
    for a, d in res["tiny_all_reduce"].items():
        print(
            f"      {a:20s} {d['rounds']:2d} rounds {d['extra_messages']:2d} extra messages"
            f" {d['median_s'] * 1e6:8.1f} us"
        )
    if "overhead_round" in res:
        print(f"  overhead_rnd{res['overhead_round'] * 1e6:8.1f} us   (same fit, per extra msg)")
    print(
        f"  beta        {res['beta'] * 1e9:9.3f} ns/B = {1 / res['beta'] / 1e9:.2f} GB/s"
        f" (exchange); one-way {1 / res['beta_one_way'] / 1e9:.2f} GB/s"
    )
    print(
        f"  gamma       {res['gamma'] * 1e9:9.3f} ns/B = {1 / res['gamma'] / 1e9:.2f} GB/s"
        f" (16 MiB); segmented {1 / res['gamma_segmented'] / 1e9:.2f} GB/s"
    )
    if "overhead" in res:
        print(f"  overhead    {res['overhead'] * 1e6:9.1f} us   per extra message in a round")


def main(argv: list[str] | None = None) -> int:
    if _bench.under_launcher():
        run()
        return 0
    args = _parse(argv)
    rest = [a for a in (argv if argv is not None else sys.argv[1:])]
    return _bench.relaunch(os.path.abspath(__file__), args.nprocs, rest, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
