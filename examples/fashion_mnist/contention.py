"""The communication one training step of the 30 MB model needs, measured with W = 2, 3 and 4
workers: ring all-reduce among the workers, one parameter server, and W parameter servers.

    python examples/fashion_mnist/contention.py [--workers 2,3,4] [--reps 3] [--rate 1gbit]

With root, every rank runs on a host of its own: Linux network namespaces joined by a
switch, each host's link shaped to --rate both ways (tools/nethosts.py, as `make multihost`
does). One job per W, on 2W hosts (workers on hosts 0..W-1, servers on W..2W-1), under
`pycollective run --nnodes 2W`, in three phases:

1. ring: the W workers all-reduce a float32 vector of the model's size (algorithm="ring");
2. one server: workers 0..W-1 and host W as the server (`pycollective.ps`, sync mode) push
   the gradient and pull the parameters;
3. W servers: the same over all 2W ranks, each server owning 1/W of the vector.

A phase's time is the slowest worker's, median of --reps (the ring's after one warm-up;
the servers' connections are warm from the setup broadcast). Bytes on each
host's link are the kernel's own counters (/sys/class/net/eth0/statistics, frames with
their TCP/IP headers), sampled every few ms by a thread in each rank and read at the
phase's start and end, so servers are counted too although they sit inside ps.serve().

Without root the same job runs on this host over loopback TCP (no shaping, no per-host
counters): the times then say what the CPU costs, not what a network would.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODEL_COUNT = 7_507_850  # parameters of models.large(): the gradient each worker sends
PHASES = ("ring", "ps1", "psW")


# ---------------------------------------------------------------------- inside a rank


class LinkSampler(threading.Thread):
    """(monotonic time, tx bytes, rx bytes) of one interface every `interval` s."""

    def __init__(self, iface: str, interval: float = 0.002) -> None:
        super().__init__(daemon=True)
        base = f"/sys/class/net/{iface}/statistics/"
        self.fds = [
            os.open(base + "tx_bytes", os.O_RDONLY),
            os.open(base + "rx_bytes", os.O_RDONLY),
        ]
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []
        self.halt = threading.Event()

    def read(self) -> tuple[float, int, int]:
        tx, rx = (int(os.pread(fd, 32, 0)) for fd in self.fds)
        return time.monotonic(), tx, rx

    def run(self) -> None:
        while not self.halt.is_set():
            self.samples.append(self.read())
            self.halt.wait(self.interval)

    def stop(self) -> None:
        self.halt.set()
        self.join()
        self.samples.append(self.read())
        for fd in self.fds:
            os.close(fd)

    def at(self, t: float, after: bool) -> tuple[int, int]:
        """Counters at time t: the last sample at or before it, or the first at or after
        it. The links are idle around a window (see _timed), so both are exact."""
        s = self.samples
        if after:
            hit = next((x for x in s if x[0] >= t), s[-1])
        else:
            hit = next((x for x in reversed(s) if x[0] <= t), s[0])
        return hit[1], hit[2]


QUIET = 0.1  # s of idle links before and after a timed window: the sampler's margin


def _timed(
    reps: int, one, sync, sampler: LinkSampler | None, warmup: bool = True
) -> dict[str, Any]:
    """Run one() reps times (after one more as a warm-up): per rep the slowest rank's
    seconds (sync() takes a local time and returns the group's maximum), the window of the
    timed reps (monotonic start, end), and this rank's link counters at its edges, read
    here and now (exact; a server, inside ps.serve(), relies on its sampler instead)."""
    times, start, edges = [], 0.0, []
    for i in range(reps + warmup):
        if i == warmup:
            time.sleep(QUIET)
        sync(0.0)  # a barrier: everyone starts together
        if i == warmup:
            start = time.monotonic()
            edges.append(sampler.read()[1:] if sampler else None)
        t0 = time.perf_counter()
        one()
        times.append(sync(time.perf_counter() - t0))
    end = time.monotonic()
    edges.append(sampler.read()[1:] if sampler else None)
    time.sleep(QUIET)
    return {"times": times[warmup:], "window": [start, end], "edges": edges}


def _worker(spec: dict[str, Any]) -> int:
    import numpy as np

    import pycollective as dist
    from pycollective import ps

    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    reps, count = spec["reps"], spec["count"]
    sampler = LinkSampler(spec["iface"]) if spec.get("iface") else None
    if sampler:
        sampler.start()
    # Every group is a prefix of the world, so group ranks are global ranks (ps.roles
    # numbers ranks in its group). Every rank makes every group, as torch wants.
    groups = {
        n: dist.new_group(list(range(n)))
        for n in sorted({m for W in spec["workers"] for m in (W, W + 1, 2 * W)})
    }
    grad = np.ones(count, dtype=np.float32)
    x = np.empty(count, dtype=np.float32)
    slowest = np.zeros(1)
    out: dict[str, dict[str, Any]] = {}

    for W in spec["workers"]:
        workers = groups[W]

        def sync(t: float, workers=workers) -> float:
            slowest[0] = t
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=workers)
            return float(slowest[0])

        dist.barrier()
        if rank < W:

            def ring(workers=workers) -> None:
                dist.all_reduce(x, algorithm="ring", group=workers)

            x.fill(1.0)
            ring()
            if x[0] != W or x[-1] != W:
                raise SystemExit(f"rank {rank}: ring all_reduce gave {x[0]}, want {W}")
            out[f"{W}/ring"] = _timed(reps, ring, sync, sampler)
        for phase, servers in (("ps1", 1), ("psW", W)):
            dist.barrier()
            n = W + servers
            if rank >= n:
                continue
            roles = ps.roles(rank, n, servers)
            if roles.is_server:
                ps.serve(roles, group=groups[n])
                continue
            params = [np.zeros(count, dtype=np.float32)]
            client = ps.Client(roles, params, {"name": "sgd", "lr": 0.001}, group=groups[n])
            # no warm-up: Client() has just broadcast the parameters over these connections
            step = _timed(reps, lambda c=client: c.step([grad]), sync, sampler, warmup=False)
            client.close()
            if not np.allclose(params[0], -0.001 * reps):
                raise SystemExit(f"rank {rank}: parameters {params[0][:3]} after the steps")
            out[f"{W}/{phase}"] = step
    dist.barrier()
    # rank 0's windows decide every host's bytes
    windows = [{k: v["window"] for k, v in out.items()}]
    dist.broadcast_object_list(windows, src=0)
    links = None
    if sampler:
        sampler.stop()
        links = {}
        for key, (t0, t1) in windows[0].items():
            mine = out.get(key, {}).get("edges")
            a, b = mine if mine else (sampler.at(t0, after=False), sampler.at(t1, after=True))
            links[key] = [(b[0] - a[0]) / reps, (b[1] - a[1]) / reps]
    everyone: list[Any] = [None] * size
    dist.all_gather_object(everyone, links)
    if rank == 0:
        result = {key: {"times": r["times"]} for key, r in out.items()}
        if sampler:
            for key, r in result.items():
                # per host (one rank each): [sent, received] bytes per step
                r["links"] = [e[key] for e in everyone]
        os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------- the driver


def _env() -> dict[str, str]:
    env = dict(os.environ, PYCOLLECTIVE_SECRET=secrets.token_hex(16), PYCOLLECTIVE_TIMEOUT="120",
               OMP_NUM_THREADS="1")  # fmt: skip
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(k, None)
    return env


def _result(out: str, what: str) -> dict:
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"no RESULT from {what}:\n{out[-2000:]}")


def _job_hosts(hosts: Any, n: int, spec: dict, port: int, timeout: float) -> dict:
    env = _env()
    env.pop("PYCOLLECTIVE_TRANSPORT", None)
    procs = []
    for k in range(n):
        cmd = [sys.executable, "-m", "pycollective", "run", "--no-prefix", "--nnodes", n,
               "--node-rank", k, "--master-addr", hosts.addrs[0], "--master-port", port,
               "-n", 1, __file__, "--worker", json.dumps(spec)]  # fmt: skip
        procs.append(hosts.popen(k, [str(c) for c in cmd], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True))  # fmt: skip
    outs = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode != 0:
                raise RuntimeError(f"the contention job failed ({p.returncode}):\n{err[-3000:]}")
            outs.append(out)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the contention job did not finish in {timeout:.0f} s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return _result(outs[0], "the contention job")


def _job_loopback(n: int, spec: dict, timeout: float) -> dict:
    env = dict(_env(), PYCOLLECTIVE_TRANSPORT="tcp")
    cmd = [sys.executable, "-m", "pycollective", "run", "--no-prefix", "-n", str(n),
           __file__, "--worker", json.dumps(spec)]  # fmt: skip
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"the loopback contention job failed:\n{res.stderr[-3000:]}")
    return _result(res.stdout, "the loopback contention job")


def _summary(raw: dict) -> dict:
    """Per W and phase: median seconds, and the bytes (per step) of the busiest host's link."""
    out: dict[str, dict] = {}
    for key, r in raw.items():
        W, phase = key.split("/")
        row = {"times": r["times"], "seconds": statistics.median(r["times"]),
               "servers": {"ring": 0, "ps1": 1, "psW": int(W)}[phase]}  # fmt: skip
        if "links" in r:
            row["links"] = r["links"]
            busiest = max(range(len(r["links"])), key=lambda h: max(r["links"][h]))
            row["busiest_host"] = busiest
            row["busiest_bytes"] = max(r["links"][busiest])
        out.setdefault(W, {})[phase] = row
    return out


def measure(
    workers: list[int], reps: int = 3, rate: str = "1gbit", count: int = MODEL_COUNT,
    log: Any = print, force_loopback: bool = False,
) -> dict:  # fmt: skip
    """Every W's three phases, in one job of 2 max(W) ranks; on namespace hosts when root
    is available, else over loopback TCP."""
    sys.path.insert(0, str(REPO / "tools"))
    import nethosts

    reason = "asked for loopback" if force_loopback else nethosts.available()
    result: dict[str, Any] = {"count": count, "bytes": 4 * count, "reps": reps, "rate": rate,
                              "workers": workers, "cpus": os.cpu_count(),
                              "load_before": os.getloadavg()[0]}  # fmt: skip
    spec = {"count": count, "reps": reps, "workers": workers}
    n = 2 * max(workers)
    t0 = time.monotonic()
    if reason:
        log(f"  no namespace hosts ({reason}): loopback TCP on this host instead; "
            "link bytes not measured, times are what the CPU costs")  # fmt: skip
        result.update(network="loopback", why=reason, link_bps=None)
        result["runs"] = _summary(_job_loopback(n, spec, 600))
    else:
        nethosts.cleanup()
        with nethosts.NetHosts(n, rate=rate) as hosts:
            links = [nethosts.measure_link(hosts, a, b, 64 << 20) for a, b in ((0, 1), (1, 0))]
            result.update(network="namespaces", link_bps=max(links), link_streams_bps=links)
            log(f"  link: {max(links) / 1e9:.3f} Gbit/s of TCP payload, one stream (best of "
                f"both ways; {time.monotonic() - t0:.0f} s)")  # fmt: skip
            port = 29000 + os.getpid() % 1000
            spec["iface"] = "eth0"
            result["runs"] = _summary(_job_hosts(hosts, n, spec, port, 600))
    for W, runs in result["runs"].items():
        log(f"  {W} workers: {_brief(runs)}")
    result["seconds"] = time.monotonic() - t0
    result["load_after"] = os.getloadavg()[0]
    return result


def _brief(runs: dict) -> str:
    return ", ".join(f"{p} {r['seconds'] * 1e3:.0f} ms" for p, r in runs.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,3,4")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--count", type=int, default=MODEL_COUNT, help="float32 elements per step")
    ap.add_argument("--loopback", action="store_true", help="run on this host even as root")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(json.loads(args.worker))
    res = measure([int(w) for w in args.workers.split(",")], args.reps, args.rate, args.count,
                  force_loopback=args.loopback)  # fmt: skip
    text = json.dumps(res, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
