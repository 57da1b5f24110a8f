"""All-reduce across namespace hosts with 1 Gbit/s links (tools/nethosts.py), against the
cost model's predictions, and a parameter server's push+pull on the same links.

    python benchmarks/multihost.py [--hosts 2,3,4] [--reps 5] [--mib 64] [--rate 1gbit]

Needs root (it builds network namespaces). Every job starts under `pycollective run
--nnodes H --node-rank k` in host k's namespace. Measured, per host count H:

* the shaped link itself: one plain TCP stream each way between two hosts, and two
  senders into one host at once (that host's switch port is the only shaper they share);
* 64 MiB float32 all_reduce by ring, halving_doubling, tree and naive, one rank per host;
  with two ranks per host also hierarchical (and flat ring across all 2H ranks);
* a 1-server parameter server: H workers (hosts 0..H-1) push 64 MiB and pull 64 MiB per
  step; the server runs on a host of its own (host H), so its one link carries H x 64 MiB
  each way per step.

A time is the slowest rank's, median of --reps after one warm-up. busbw = (n / t) x
2 (p-1)/p for all_reduce (nccl-tests), p = hosts with one rank per host; for two ranks
per host the factor uses p = H, since a host's link is the resource (2 (H-1)/H n bytes
each way per host is the least any all-reduce must move). Predictions: cost.predict() on
the shaped link's alpha/beta (one rank per host), schedule/topology.predict() with shared
memory inside a host (two per host). Writes benchmarks/results/multihost.json and
docs/multihost_scaling.png.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FLAT = ("ring", "halving_doubling", "tree", "naive")
ALPHA = 200e-6  # s per round: pycollective's TCP alpha (src/pycollective/_tuning.py)
GAMMA = 0.12e-9  # s per byte reduced (numpy add, _tuning.py)
OVERHEAD = 100e-6  # s per extra message in a round (_tuning.py)
SHM_ALPHA, SHM_BETA = 20e-6, 0.3e-9  # inside a host: 64 MiB shm all_reduce at 2 ranks, docs/shm.md


# ---------------------------------------------------------------------- one rank


def _worker(spec: dict) -> int:
    import numpy as np

    import pycollective as dist

    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    if spec["kind"] == "ps":
        return _ps_worker(spec, rank, size)
    x = np.empty(spec["count"], dtype=np.float32)
    out: dict[str, dict[str, list[float]]] = {}
    slowest = np.zeros(2)
    for algo in spec["algorithms"]:
        times, cpu = [], []
        for i in range(1 + spec["reps"]):
            x.fill(rank + 1.0)
            dist.barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            dist.all_reduce(x, algorithm=algo)
            slowest[:] = time.perf_counter() - t0, time.process_time() - c0
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if i:
                times.append(float(slowest[0]))
                cpu.append(float(slowest[1]))
        want = size * (size + 1) / 2
        if not (x[0] == want and x[-1] == want):
            raise SystemExit(f"rank {rank}: {algo} gave {x[0]}, {x[-1]}, want {want}")
        out[algo] = {"times": times, "cpu": cpu}
    if rank == 0:
        os.write(1, ("RESULT " + json.dumps(out) + "\n").encode())
    dist.destroy_process_group()
    return 0


def _ps_worker(spec: dict, rank: int, size: int) -> int:
    import numpy as np

    import pycollective as dist
    from pycollective import ps

    roles = ps.roles(rank, size, 1)
    workers = dist.new_group(list(roles.worker_ranks))  # every rank makes it, as torch wants
    if roles.is_server:
        ps.serve(roles)
        ps.shutdown()
        return 0
    params = [np.zeros(spec["count"], dtype=np.float32)]
    grads = [np.ones(spec["count"], dtype=np.float32)]
    client = ps.Client(roles, params, {"name": "sgd", "lr": 0.001})
    times, cpu = [], []
    slowest = np.zeros(2)
    for i in range(1 + spec["reps"]):
        dist.barrier(group=workers)
        c0, t0 = time.process_time(), time.perf_counter()
        client.step(grads)
        slowest[:] = time.perf_counter() - t0, time.process_time() - c0
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=workers)
        if i:
            times.append(float(slowest[0]))
            cpu.append(float(slowest[1]))
    client.close()
    if not np.allclose(params[0], -0.001 * (1 + spec["reps"])):
        raise SystemExit(f"rank {rank}: parameters {params[0][:3]} after the steps")
    if rank == 0:
        os.write(1, ("RESULT " + json.dumps({"ps": {"times": times, "cpu": cpu}}) + "\n").encode())
    ps.shutdown()
    return 0


# ---------------------------------------------------------------------- the driver


def _job(
    hosts, nhosts: int, per_host: int, spec: dict, port: int, timeout: float,
    nice: int = 0, rt: bool = False,
) -> dict:  # fmt: skip
    """Run one job on hosts 0..nhosts-1 under `pycollective run`; rank 0's RESULT."""
    env = dict(os.environ, PYCOLLECTIVE_SECRET=secrets.token_hex(16), PYCOLLECTIVE_TIMEOUT="120")
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYCOLLECTIVE_TRANSPORT"):
        env.pop(k, None)
    procs = []
    for k in range(nhosts):
        cmd = ["chrt", "-r", "10"] if rt else ["nice", "-n", nice] if nice else []
        cmd += [sys.executable, "-m", "pycollective", "run", "--no-prefix", "--nnodes", nhosts,
               "--node-rank", k, "--master-addr", hosts.addrs[0], "--master-port", port,
               "-n", per_host, __file__, "--worker", json.dumps(spec)]  # fmt: skip
        procs.append(hosts.popen(k, [str(c) for c in cmd], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True))  # fmt: skip
    outs = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"job {spec} did not finish in {timeout} s") from None
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise RuntimeError(f"job {spec} failed ({p.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
        outs.append(out)
    for line in outs[0].splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"no RESULT from job {spec}:\n{outs[0][-2000:]}")


_FAN_IN_RECEIVER = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(60)
print("ready", flush=True)
c, _ = s.accept(); c.settimeout(60); buf = bytearray(1 << 20); got = 0; t0 = None
while True:
    k = c.recv_into(buf)
    if t0 is None: t0 = time.monotonic()
    if not k: break
    got += k
c.sendall(b"x"); print(got, t0, time.monotonic(), flush=True)
"""


def _fan_in(hosts, port: int, nbytes: int) -> float:
    """Hosts 1 and 2 send to host 0 at once: bit/s host 0 receives in all, from the first
    byte either receiver saw to the last (CLOCK_MONOTONIC is one clock for all processes)."""
    from tools import nethosts

    recv = [
        hosts.popen(0, [sys.executable, "-c", _FAN_IN_RECEIVER, hosts.addrs[0], str(port + i)],
                    stdout=subprocess.PIPE, text=True)
        for i in range(2)
    ]  # fmt: skip
    for r in recv:
        assert r.stdout is not None
        r.stdout.readline()
    send = [
        hosts.popen(1 + i, [sys.executable, "-c", nethosts._SENDER, hosts.addrs[0],
                            str(port + i), str(nbytes)])
        for i in range(2)
    ]  # fmt: skip
    for s in send:
        s.wait(timeout=120)
    got, starts, ends = 0, [], []
    for r in recv:
        n, t0, t1 = r.communicate(timeout=30)[0].split()
        got += int(n)
        starts.append(float(t0))
        ends.append(float(t1))
    return got * 8 / (max(ends) - min(starts))


def _ceiling(rate: str) -> float | None:
    """TCP payload bit/s through tbf at `rate`: tbf counts whole Ethernet frames, and a
    1500-byte MTU frame carries 1448 payload bytes (TCP with timestamps) in 1514."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale * 1448 / 1514
    return None


def derive_row(row: dict, nbytes: int, link: float) -> None:
    """Median, bandwidths, the model's prediction and its error, from a row's raw times."""
    h, per_host, algo = row["hosts"], row["ranks_per_host"], row["algorithm"]
    med = statistics.median(row["times"])
    row["median_s"] = med
    row["algbw_Bps"] = nbytes / med
    if row.get("cpu"):
        row["cpu_s_busiest_rank"] = statistics.median(row["cpu"])
    if algo == "ps":
        # Sync mode: the server takes h pushes of n bytes in, updates, then sends h pulls
        # of n out; its one link is the bottleneck both times.
        row["predicted_s"] = 2 * h * nbytes * 8 / link
        row["server_link_fraction"] = row["predicted_s"] / med
    else:
        factor = 2 * (h - 1) / h
        row["busbw_Bps"] = nbytes / med * factor
        row["busbw_fraction_of_link"] = nbytes / med * factor * 8 / link
        row["busbw_fraction_of_nominal"] = nbytes / med * factor * 8 / 1e9
        row["predicted_s"] = _predict(algo, h, per_host, nbytes // 4, link)
        if per_host == 1:
            row["formula_s"] = _formula(algo, h, nbytes, link)
    row["prediction_error"] = (row["predicted_s"] - med) / med


def rederive(result: dict) -> None:
    link = max(result["link"]["one_stream_0_to_1_bps"] + result["link"]["one_stream_1_to_0_bps"])
    result["link"]["goodput_bps"] = link
    result["link"].setdefault("tcp_payload_ceiling_bps", _ceiling(result["rate"]))
    for row in result["runs"]:
        derive_row(row, result["bytes"], link)


def _predict(algo: str, nhosts: int, per_host: int, count: int, link_bps: float) -> float:
    from pycollective.schedule import cost, topology

    inter = cost.CostParams(alpha=ALPHA, beta=8 / link_bps, gamma=GAMMA, overhead=OVERHEAD)
    if per_host == 1:
        return cost.predict("all_reduce", algo, nhosts, count, 4, inter)
    intra = cost.CostParams(alpha=SHM_ALPHA, beta=SHM_BETA, gamma=GAMMA)
    return topology.predict(algo, count, 4, topology.Topology(nhosts, per_host, intra, inter))


def _formula(algo: str, nhosts: int, nbytes: int, link_bps: float) -> float | None:
    from pycollective.schedule import cost

    inter = cost.CostParams(alpha=ALPHA, beta=8 / link_bps, gamma=GAMMA)
    try:
        return cost.formula("all_reduce", algo, nhosts, nbytes, inter)
    except ValueError:
        return None


def _algorithms_available() -> tuple[str, ...]:
    import pycollective

    names = tuple(pycollective.algorithms("all_reduce"))
    try:  # accepted by algorithm= though algorithms() does not list it
        from pycollective.runners import hierarchical as _hierarchy

        names += (_hierarchy.ALGORITHM,)
    except ImportError:
        pass
    return names


def _commit() -> str:
    res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                         text=True)  # fmt: skip
    return res.stdout.strip()


def _load() -> float:
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="2,3,4")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "multihost.json"))
    ap.add_argument("--plot", default=str(REPO / "docs" / "multihost_scaling.png"))
    ap.add_argument("--no-ps", action="store_true")
    ap.add_argument(
        "--nice", type=int, default=0,
        help="run the ranks at this nice level (e.g. -10: ahead of other jobs on a busy machine)",
    )  # fmt: skip
    ap.add_argument(
        "--rt", action="store_true",
        help="run the ranks with a real-time priority (chrt -r 10): an experiment that takes "
        "the other jobs of a busy machine out of the picture",
    )  # fmt: skip
    ap.add_argument("--only", default="", help="comma-separated algorithms to run (default all)")
    ap.add_argument(
        "--sysctl", action="append", default=[], metavar="KEY=VALUE",
        help="a per-namespace sysctl for every host, e.g. net.ipv4.tcp_wmem='4096 16384 8388608'",
    )  # fmt: skip
    ap.add_argument("--no-two-per-host", action="store_true")
    ap.add_argument("--markdown", metavar="JSON", help="print the tables of a results file")
    ap.add_argument("--rederive", metavar="JSON", help="recompute a results file's derived numbers")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(json.loads(args.worker))
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    if args.rederive:  # recompute every derived number (e.g. after a model change)
        res = json.loads(Path(args.rederive).read_text())
        rederive(res)
        Path(args.rederive).write_text(json.dumps(res, indent=1) + "\n")
        _plot(res, args.plot)
        return 0

    from tools import nethosts

    reason = nethosts.available()
    if reason:
        print(f"multihost benchmark: {reason}", file=sys.stderr)
        return 2
    nethosts.cleanup()
    host_counts = [int(h) for h in args.hosts.split(",")]
    count = args.mib * (1 << 20) // 4
    nbytes = count * 4
    have = _algorithms_available()
    two_per_host = [a for a in ("hierarchical", "ring") if a in have]
    result: dict = {
        "rate": args.rate, "bytes": nbytes, "dtype": "float32", "reps": args.reps,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nice": args.nice, "rt": args.rt, "cpus": os.cpu_count(), "commit": _commit(),
        "model": {"alpha": ALPHA, "gamma": GAMMA, "overhead": OVERHEAD,
                  "shm_alpha": SHM_ALPHA, "shm_beta": SHM_BETA},
        "runs": [],
    }  # fmt: skip
    port = 29000 + os.getpid() % 1000
    total_hosts = max(host_counts) + (0 if args.no_ps else 1)
    with nethosts.NetHosts(max(total_hosts, 3), rate=args.rate) as hosts:
        for setting in args.sysctl:
            for k in range(hosts.n):
                hosts.run(k, ["sysctl", "-q", "-w", setting], check=True)
        result["sysctl"] = args.sysctl
        fwd = [nethosts.measure_link(hosts, 0, 1, 256 << 20) for _ in range(3)]
        back = [nethosts.measure_link(hosts, 1, 0, 256 << 20) for _ in range(3)]
        fan_in = _fan_in(hosts, 5301, 128 << 20)
        # The best of the single streams: a stream only falls short of the shaper when
        # its sender or receiver waits for a CPU (other jobs on the machine).
        link = max(fwd + back)
        result["link"] = {"one_stream_0_to_1_bps": fwd, "one_stream_1_to_0_bps": back,
                          "two_senders_into_host0_bps": fan_in, "goodput_bps": link,
                          "tcp_payload_ceiling_bps": _ceiling(args.rate),
                          "qdisc_host0": hosts.qdisc_stats(0)}  # fmt: skip
        print(f"link: {link / 1e9:.3f} Gbit/s one stream (best of {len(fwd + back)}), two "
              f"senders into one host {fan_in / 1e9:.3f} Gbit/s in all", flush=True)  # fmt: skip
        plan = []
        only = set(args.only.split(",")) - {""}
        for h in host_counts:
            plan.append((h, 1, "all_reduce", [a for a in FLAT if a in have]))
            if not args.no_two_per_host and two_per_host:
                plan.append((h, 2, "all_reduce", two_per_host))
            if not args.no_ps:
                plan.append((h, 1, "ps", ["ps"]))
        for h, per_host, kind, algos in plan:
            algos = [a for a in algos if not only or a in only]
            if not algos:
                continue
            port += 1
            spec = {"kind": kind, "count": count, "reps": args.reps, "algorithms": algos}
            load0 = _load()
            t0 = time.monotonic()
            njob_hosts = h + 1 if kind == "ps" else h
            times = _job(hosts, njob_hosts, per_host, spec, port, 900, args.nice, args.rt)
            for algo, got in times.items():
                row = {"hosts": h, "ranks_per_host": per_host, "algorithm": algo,
                       "times": got["times"], "cpu": got["cpu"],
                       "load_before": load0, "load_after": _load()}  # fmt: skip
                derive_row(row, nbytes, link)
                result["runs"].append(row)
                frac = row.get("busbw_fraction_of_link", row.get("server_link_fraction"))
                what = "busbw" if kind != "ps" else "server link"
                print(f"{h} hosts x {per_host} {algo:18s} {row['median_s'] * 1e3:8.1f} ms  "
                      f"{what} {frac:6.1%} of link  predicted {row['predicted_s'] * 1e3:8.1f} ms "
                      f"({row['prediction_error']:+.0%})  cpu {row['cpu_s_busiest_rank']:.2f} s"
                      f"  load {load0:.1f}", flush=True)  # fmt: skip
            print(f"  ({time.monotonic() - t0:.0f} s)", flush=True)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, args.plot)
    print(f"wrote {args.json} and {args.plot}")
    return 0


def markdown(result: dict) -> str:
    """The results as markdown tables: all_reduce, then the parameter server."""
    link = result["link"]["goodput_bps"]
    lines = [
        f"Link: {link / 1e9:.3f} Gbit/s goodput (best single TCP stream), "
        f"{result['link']['two_senders_into_host0_bps'] / 1e9:.3f} Gbit/s from two senders "
        f"into one host; {result['bytes'] >> 20} MiB float32; median of {result['reps']}.",
        "",
        "| hosts x ranks | algorithm | time | busbw | % of link | predicted | error |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = sorted(result["runs"], key=lambda r: (r["ranks_per_host"], r["hosts"]))
    for r in rows:
        if r["algorithm"] == "ps":
            continue
        lines.append(
            f"| {r['hosts']} x {r['ranks_per_host']} | {r['algorithm']} | "
            f"{r['median_s'] * 1e3:.0f} ms | {r['busbw_Bps'] * 8 / 1e9:.3f} Gbit/s | "
            f"{r['busbw_fraction_of_link']:.1%} | {r['predicted_s'] * 1e3:.0f} ms | "
            f"{r['prediction_error']:+.0%} |"
        )
    ps_rows = [r for r in rows if r["algorithm"] == "ps"]
    if ps_rows:
        lines += [
            "",
            "| workers (1 per host) + server host | time per push+pull | server link busy "
            "| predicted (2 W n / link) | error |",
            "|---|---|---|---|---|",
        ]
        for r in ps_rows:
            lines.append(
                f"| {r['hosts']} + 1 | {r['median_s'] * 1e3:.0f} ms | "
                f"{r['server_link_fraction']:.1%} | {r['predicted_s'] * 1e3:.0f} ms | "
                f"{r['prediction_error']:+.0%} |"
            )
    return "\n".join(lines)


def _plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    series: dict[tuple[str, int], list[dict]] = {}
    for row in result["runs"]:
        series.setdefault((row["algorithm"], row["ranks_per_host"]), []).append(row)
    for i, ((algo, per_host), rows) in enumerate(sorted(series.items())):
        rows.sort(key=lambda r: r["hosts"])
        xs = [r["hosts"] for r in rows]
        label = algo if per_host == 1 else f"{algo} ({per_host}/host)"
        if algo == "ps":
            label = "parameter server push+pull (server host)"
        color = f"C{i}"
        ax.plot(xs, [r["median_s"] for r in rows], "o-", color=color, label=label)
        ax.plot(xs, [r["predicted_s"] for r in rows], "x--", color=color, alpha=0.6)
    link = result["link"]["goodput_bps"]
    ax.set_xlabel("hosts (each with a 1 Gbit/s link, tbf both ways)")
    ax.set_ylabel(f"seconds per {result['bytes'] >> 20} MiB float32 all_reduce")
    ax.set_xticks(sorted({r["hosts"] for r in result["runs"]}))
    rt = ", ranks at real-time priority" if result.get("rt") else ""
    ax.set_title(f"All-reduce across namespace hosts (link goodput {link / 1e9:.2f} Gbit/s{rt}); "
                 "dashed: cost model", fontsize=10)  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
