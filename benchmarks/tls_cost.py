"""What TLS costs: the same all_reduce over plain TCP and over TLS 1.3, in the same ranks
and the same run, taking turns repetition by repetition (benchmarks/_bench.interleaved), so
a noisy spell on a shared machine hits both alike.

    python benchmarks/tls_cost.py [--sizes 4,1M,64M] [--json FILE]

Two jobs of 2 ranks: on loopback (started by `pycollective run`), and across two
network-namespace hosts on an unshaped veth link (tools/nethosts.py; needs root, else it
is left out and says why). Each rank holds two worlds of the same job: its default group
over plain TCP (PYCOLLECTIVE_TRANSPORT=tcp) and a second world whose every connection runs
TLS (the per-job CA derived from the job's key, as PYCOLLECTIVE_TLS=1 would). Prints a
table (time per call, median; TLS over plain) and writes JSON
(benchmarks/results/tls_cost.json). Part of `make compare`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tools"))

DEFAULT_JSON = HERE / "results" / "tls_cost.json"


def rank_side(sizes: list[int], reps: int, budget: float) -> None:
    """Run on each rank: both worlds, every size, interleaved; rank 0 prints TLS {json}."""
    import _bench
    import numpy as np

    import pycollective as dist
    from pycollective import _auth, _keys, _tls
    from pycollective.core import rendezvous
    from pycollective.core.group import ProcessGroup

    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    world = dist.group.WORLD.world
    creds = _auth.Credentials(_keys.job_key(), _tls.TLSConfig())
    tls_world = rendezvous.connect_world(
        rank, size, world.store, 60.0, "tls-cost", master_addr=os.environ.get("MASTER_ADDR"),
        multi_node=os.environ.get("NETHOST") == "1", creds=creds,
    )  # fmt: skip
    tls_group = ProcessGroup(tls_world, tuple(range(size)), 0x7153, "tls", 60.0)
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        a, b = np.ones(count, np.float32), np.ones(count, np.float32)
        batch = max(1, min(200, (4 << 20) // max(nbytes, 1)))

        def plain(x=a, k=batch) -> None:
            for _ in range(k):
                dist.all_reduce(x)

        def over_tls(x=b, k=batch) -> None:
            for _ in range(k):
                dist.all_reduce(x, group=tls_group)

        times = _bench.interleaved(
            dist, {"plain": plain, "tls": over_tls}, reps, budget, warmup=2, min_reps=7
        )
        if rank == 0:
            row = {name: _bench.median(ts) / batch for name, ts in times.items()}
            row.update(bytes=nbytes, reps=len(times["plain"]), batch=batch)
            print("TLS " + json.dumps(row), flush=True)
    rendezvous.close_world(tls_world)
    dist.destroy_process_group()


def _spec(args: argparse.Namespace) -> list[str]:
    return ["--rank-side", "--sizes", args.sizes, "--reps", str(args.reps),
            "--budget", str(args.budget)]  # fmt: skip


def _rows(out: str) -> list[dict]:
    """Rank 0's lines (under `pycollective run` they carry a "[rank 0]: " prefix)."""
    return [
        json.loads(line[line.find("TLS ") + 4 :]) for line in out.splitlines() if "TLS {" in line
    ]


def loopback_job(args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYCOLLECTIVE_TRANSPORT": "tcp", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "pycollective", "run", "-n", "2", __file__, *_spec(args)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode:
        return {"error": out.stderr[-2000:]}
    return {"rows": _rows(out.stdout)}


def nethost_job(args: argparse.Namespace) -> dict:
    import nethosts

    why = nethosts.available()
    if why:
        return {"skipped": why}
    env = {
        **os.environ,
        "PYCOLLECTIVE_TRANSPORT": "tcp",
        "PYTHONUNBUFFERED": "1",
        "WORLD_SIZE": "2",
        "MASTER_PORT": "29533",
        "NETHOST": "1",
        "PYCOLLECTIVE_SECRET": os.environ.get("PYCOLLECTIVE_SECRET") or secrets.token_hex(32),
    }
    # fmt: skip
    with nethosts.NetHosts(2) as hosts:
        env["MASTER_ADDR"] = hosts.addrs[0]
        procs = [
            hosts.popen(k, [sys.executable, __file__, *_spec(args)],
                        env={**env, "RANK": str(k), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for k in range(2)
        ]  # fmt: skip
        outs = [p.communicate(timeout=args.timeout) for p in procs]
    if any(p.returncode for p in procs):
        return {"error": "\n".join(err[-1500:] for _, err in outs)}
    return {"rows": _rows(outs[0][0])}


def _fmt(t: float) -> str:
    return f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"


def table(jobs: dict[str, dict]) -> list[str]:
    lines = ["| job | size | plain TCP | TLS 1.3 | TLS / plain |", "|---|--:|--:|--:|--:|"]
    for name, job in jobs.items():
        if "rows" not in job:
            lines.append(f"| {name} | - | {job.get('skipped') or 'failed'} | | |")
            continue
        for r in job["rows"]:
            size = r["bytes"]
            human = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size} B"
            ratio = r["tls"] / r["plain"] if r["plain"] else float("nan")
            lines.append(
                f"| {name} | {human} | {_fmt(r['plain'])} | {_fmt(r['tls'])} | {ratio:.2f}x |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="4,1M,64M")
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--budget", type=float, default=20.0, help="seconds per size, both together")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", default=str(DEFAULT_JSON))
    p.add_argument("--jobs", default="loopback,nethosts")
    p.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from pycollective.cli.bench import parse_size

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.rank_side:
        rank_side(sizes, args.reps, args.budget)
        return 0
    before = os.getloadavg()[0]
    jobs: dict[str, dict] = {}
    for name in args.jobs.split(","):
        t0 = time.monotonic()
        jobs[name] = {"loopback": loopback_job, "nethosts": nethost_job}[name](args)
        jobs[name]["seconds"] = time.monotonic() - t0
    after = os.getloadavg()[0]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"TLS cost, measured {when}, 2 ranks, float32 all_reduce, median per call; "
        f"1-minute load {before:.2f} before, {after:.2f} after (the ranks add about 2).",
        "",
        *table(jobs),
    ]
    print("\n".join(lines))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps({"when": when, "load": [before, after], "jobs": jobs}, indent=1)
    )
    return 1 if any("error" in j for j in jobs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
