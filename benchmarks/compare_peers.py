"""pycollective beside torch.distributed's gloo and OpenMPI (mpi4py), in one run, on one host.

    python benchmarks/compare_peers.py            # or: make compare
    python benchmarks/compare_peers.py -n 2 --markdown table.md

Three jobs, each a set of ranks in which every library takes turns, repetition by
repetition (see _peers_worker.py), so the load of a shared machine falls on all alike:

- shm: N ranks (default 2), pycollective as a user gets it (auto: shared memory on one
  host), gloo, and OpenMPI as mpirun starts it (shared memory too); all_reduce over a range
  of sizes (OpenMPI both out of place and with MPI_IN_PLACE), and broadcast, all_gather and
  reduce_scatter at the big size (default 64 MiB).
- tcp: the same with PYCOLLECTIVE_TRANSPORT=tcp and OpenMPI over TCP only
  (--mca pml ob1 --mca btl tcp,self, loopback); all_reduce over the range of sizes.
- crowded: 4 ranks on the machine's 2 cores (mpirun --oversubscribe): all_reduce 4 B and
  16 MiB.
- xhost: across two network-namespace hosts (tools/nethosts.py; root), 2 hosts x 1 and
  2 hosts x 2 ranks started by mpirun through an `ip netns exec` agent: pycollective as a
  user gets it (TCP between the hosts), gloo and OpenMPI (btl tcp between the hosts);
  all_reduce over the range of sizes, with one TCP stream's goodput between the hosts,
  measured in the same run, as the reference (_crosshost.py). --xhost-runs R repeats the
  whole job R times and shows the spread (min, median, max of the runs' medians).

Sizes are nccl-tests' (the larger buffer of a call), float32. Time is the median of at
least 11 repetitions after warm-up, each the slowest rank's; busbw uses nccl-tests'
factors. "vs gloo" and "vs OpenMPI" are how many times faster pycollective is (their time
over ours), against OpenMPI's in-place all_reduce where measured. Also measured: what one
core of numpy copies and adds per second, the ceiling a rank's own work runs into.

With --runs N every job runs N times, each time in new processes, and a last table gives
each cell's spread over the runs (min / median / max of the runs' medians, and max/min),
OpenMPI's beside ours: `--runs 10 --jobs shm -b 64M -e 64M` is the 64 MiB spread. The main
table's cells, its ratios and the goals are then the median over the runs.

Prints markdown tables, writes JSON (benchmarks/results/compare_peers.json) and, with
--markdown FILE, the tables to a file; --readme README.md puts them into the README's speed
section (between its compare_peers markers). Run as root it installs what is missing
(Debian's openmpi-bin and libopenmpi-dev; mpi4py into this Python's environment, also when
that is a venv); otherwise it says how and leaves the OpenMPI columns out. Without
mpirun the ranks are started by `pycollective run`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pycollective._netutil import free_port
from pycollective.cli.bench import human, parse_size, sizes

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # its sibling modules, also when imported as benchmarks.compare_peers
import _crosshost  # noqa: E402
import _deepspeed  # noqa: E402

REPO = HERE.parent
WORKER = HERE / "_peers_worker.py"
DEFAULT_JSON = HERE / "results" / "compare_peers.json"
APT = ("openmpi-bin", "libopenmpi-dev")

# Columns of every table: (key, how a job's record is recognised: transport, algorithm).
# pycollective_shared: the one-host job's all_reduce on buffers from pycollective.empty
COLUMNS = (
    "pycollective",
    "pycollective_shared",
    "gloo",
    "openmpi",
    "openmpi_in_place",
    "deepspeed",
)
_COLUMN_OF = {
    ("gloo", "gloo"): "gloo",
    ("openmpi", "out_of_place"): "openmpi",
    ("openmpi", "in_place"): "openmpi_in_place",
    ("deepspeed", "shm"): "deepspeed",
}


@dataclass
class Job:
    name: str
    title: str
    ranks: int
    plan: list[tuple[str, list[int]]]
    ours: str  # backend name in the worker: "shm" (auto) or "tcp"
    env: dict[str, str | None] = field(default_factory=dict)
    mpi_args: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    deepspeed: bool = False  # DeepSpeed's shm all-reduce takes part (in its venv's Python)
    shared: bool = False  # ours also on shared buffers (pycollective.empty), all_reduce
    per_host: int = 0  # > 0: the cross-host job, this many ranks on each of two hosts


# ----------------------------------------------------------------------------- set-up


def find_openmpi() -> str | None:
    """OpenMPI's mpirun (with MPICH installed too, plain `mpirun` may be MPICH's)."""
    for name in ("mpirun.openmpi", "mpirun"):
        path = shutil.which(name)
        if not path:
            continue
        try:
            out = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=30
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if "Open MPI" in out:
            return path
    return None


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def ensure_openmpi(allow_install: bool) -> tuple[str | None, str | None]:
    """(mpirun, None), or (None, why the OpenMPI columns are left out and how to fix it)."""
    mpirun = find_openmpi()
    if mpirun is None and allow_install and _is_root() and shutil.which("apt-get"):
        print(f"# installing {' '.join(APT)} (apt-get)", flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", *APT],
            env=env,
            check=False,
            stdout=subprocess.DEVNULL,
        )
        mpirun = find_openmpi()
    if mpirun is None:
        return None, f"OpenMPI's mpirun is not installed (as root: apt-get install {' '.join(APT)})"
    if importlib.util.find_spec("mpi4py") is None:
        in_venv = sys.prefix != sys.base_prefix
        if allow_install and (in_venv or _is_root()):
            print("# installing mpi4py (pip)", flush=True)
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "mpi4py"], check=False
            )
            importlib.invalidate_caches()
        if importlib.util.find_spec("mpi4py") is None:
            how = f"{Path(sys.executable).name} -m pip install mpi4py"
            return None, f"mpi4py is not installed ({how})"
    return mpirun, None


def gloo_missing() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install torch==2.13.0, CPU build; or make setup)"
    return None


# ----------------------------------------------------------------------------- measuring


def numpy_limits(nbytes: int, samples: int) -> dict:
    """What one core of numpy copies (np.copyto) and adds (np.add, out=) per second on
    float32 arrays of `nbytes`: the ceiling of a rank's own share of the work. Bytes/s
    counts the destination's bytes once (a copy reads n and writes n; an add reads 2n)."""
    n = max(1, nbytes // 4)
    a, b, out = np.ones(n, np.float32), np.ones(n, np.float32), np.empty(n, np.float32)
    result = {"bytes": n * 4}
    for name, fn in (("memcpy", lambda: np.copyto(out, a)), ("add", lambda: np.add(a, b, out=out))):
        fn()
        times = []
        for _ in range(samples):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        result[f"{name}_GBps"] = n * 4 / statistics.median(times) / 1e9
    return result


class LoadSampler:
    """The 1-minute load average every few seconds while the jobs run (a shared machine's
    load changes within a run; before and after alone can mislead)."""

    def __init__(self, every: float = 5.0) -> None:
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join()
        return [*self.samples, os.getloadavg()[0]]


def _clean_env(job: Job) -> dict[str, str]:
    env = dict(os.environ)
    for key in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "PYCOLLECTIVE_STORE_HOSTED",
        "TORCHELASTIC_USE_AGENT_STORE",
        "PYCOLLECTIVE_TRANSPORT",
        "PYCOLLECTIVE_TIMELINE",
    ):
        env.pop(key, None)
    for key, value in job.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _display(cmd: list[str]) -> str:
    """The command as a reader would type it (no paths of this machine)."""
    out = []
    for c in cmd:
        if c in (sys.executable, str(_deepspeed.python())):
            out.append("python")
        elif c.startswith("{"):
            out.append("SPEC")
        elif os.path.isabs(c):
            p = Path(c)
            out.append(str(p.relative_to(REPO)) if p.is_relative_to(REPO) else p.name)
        else:
            out.append(c)
    return " ".join(out)


def job_command(
    job: Job,
    backends: list[str],
    mpirun: str | None,
    spec: str,
    env: dict[str, str],
    extra: Sequence[str] = (),
) -> list[str]:
    """The command that starts the job's ranks: mpirun when OpenMPI takes part, else our
    launcher. Adds what mpirun's ranks need to `env`. With DeepSpeed, the ranks run its
    venv's Python (which has pycollective, torch and mpi4py too)."""
    python = str(_deepspeed.python()) if "deepspeed" in backends else sys.executable
    worker = [python, str(WORKER), spec]
    if mpirun is None or "openmpi" not in backends:
        return [python, "-m", "pycollective", "run", "-n", str(job.ranks), *worker]
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    cmd = [mpirun, "-n", str(job.ranks)]
    if _is_root():
        cmd.append("--allow-run-as-root")
    if job.ranks > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    cmd += [
        *job.mpi_args,
        *extra,
        "-x",
        "MASTER_ADDR",
        "-x",
        "MASTER_PORT",
        "-x",
        "PYTHONUNBUFFERED",
    ]
    if "PYCOLLECTIVE_TRANSPORT" in env:
        cmd += ["-x", "PYCOLLECTIVE_TRANSPORT"]
    return cmd + worker


def run_job(
    job: Job,
    backends: list[str],
    mpirun: str | None,
    args: argparse.Namespace,
    hosts: _crosshost.nethosts.NetHosts | None = None,
) -> dict:
    """Start the job's ranks; return what rank 0 reported (records, meta) or the error.
    A cross-host job (job.per_host) runs mpirun in `hosts`' host 0."""
    spec = {
        "backends": backends,
        "plan": job.plan,
        "algorithms": ["auto"],
        "dtype": "float32",
        "reps": max(args.reps, args.min_reps),
        "min_reps": args.min_reps,
        "warmup": max(1, args.warmup),
        "budget": args.budget,
        "gloo_port": free_port(),
    }
    env = _clean_env(job)
    workdir = None
    if job.per_host:
        assert hosts is not None and mpirun is not None  # noqa: S101 - checked by the caller
        spec["gloo_addr"] = hosts.addrs[0]
        workdir = _crosshost.private_dir()
        agent, hostfile = _crosshost.write_launch_files(workdir, hosts, job.per_host)
        env.setdefault("PYTHONPATH", "")
        worker = [sys.executable, str(WORKER), json.dumps(spec)]
        cmd = _crosshost.mpirun_command(
            mpirun, hosts, job.per_host, agent, hostfile, free_port(), worker,
            shlex.split(args.mpirun_args),
        )  # fmt: skip
        start = hosts.popen
    else:
        cmd = job_command(
            job, backends, mpirun, json.dumps(spec), env, shlex.split(args.mpirun_args)
        )
        start = None
    result: dict = {
        "name": job.name,
        "title": job.title,
        "ranks": job.ranks,
        "command": _display(cmd),
        "backends": backends,
        "records": [],
        "meta": {},
    }
    print(f"# job {job.name}: {_display(cmd)}", flush=True)
    with tempfile.TemporaryFile(mode="w+") as err:
        popen_kw = dict(
            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True,
            start_new_session=True,
        )  # fmt: skip
        proc = start(0, cmd, **popen_kw) if start else subprocess.Popen(cmd, **popen_kw)
        timed_out = threading.Event()

        def kill() -> None:  # the job's own process group only
            timed_out.set()
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    return
                time.sleep(3)

        watchdog = threading.Timer(args.timeout, kill)
        watchdog.start()
        try:
            assert proc.stdout is not None  # noqa: S101 - piped above
            for line in proc.stdout:
                for tag in ("BENCH ", "META "):
                    at = line.find(tag)
                    if at < 0:
                        continue
                    data = json.loads(line[at + len(tag) :])
                    if tag == "META ":
                        result["meta"].update(data)
                    else:
                        result["records"].append(data)
                        print(f"#   {_progress(job, data)}", flush=True)
            proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                kill()
        if proc.returncode != 0 or timed_out.is_set():
            err.seek(0)
            tail = err.read()[-3000:]
            why = (
                f"timed out after {args.timeout:.0f} s"
                if timed_out.is_set()
                else (f"exited with {proc.returncode}")
            )
            result["error"] = f"job {job.name} {why}:\n{tail}"
            print(result["error"], file=sys.stderr, flush=True)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def _progress(job: Job, r: dict) -> str:
    if "error" in r:
        return f"{r['collective']} {human(r['bytes'])} {r['transport']}: {r['error']}"
    return (
        f"{r['collective']} {human(r['bytes'])} {r['transport']}/{r['algorithm']}: "
        f"{fmt_time(r['time_us'])}, busbw {r['busbw']:.3g} GB/s ({r['reps']} reps)"
    )


# ----------------------------------------------------------------------------- tables


def fmt_time(us: float) -> str:
    if us < 1000:
        return f"{us:.3g} us"
    if us < 1e6:
        return f"{us / 1e3:.3g} ms"
    return f"{us / 1e6:.3g} s"


def build_rows(job: Job, result: dict) -> list[dict]:
    """One row per (collective, size): each column's time and busbw, and the ratios."""
    rows: dict[tuple[str, int], dict] = {}
    for r in result["records"]:
        key = (r["collective"], r["bytes"])
        row = rows.setdefault(
            key,
            {
                "job": job.name,
                "collective": r["collective"],
                "bytes": r["bytes"],
                "ranks": job.ranks,
                "columns": dict.fromkeys(COLUMNS),
            },
        )
        if r["transport"] == job.ours:
            column = "pycollective"
        elif r["transport"] == "shm_shared":
            column = "pycollective_shared"
        else:
            column = _COLUMN_OF.get((r["transport"], r["algorithm"]))
        if column is None:
            continue
        if "error" in r:
            row["columns"][column] = {"error": r["error"]}
            continue
        row["columns"][column] = {
            "time_us": r["time_us"],
            "busbw_GBps": r["busbw"],
            "algbw_GBps": r["algbw"],
            "reps": r["reps"],
            "batch": r["batch"],
            "ran": r.get("ran"),
        }
    for row in rows.values():
        _add_ratios(row)
    return list(rows.values())


def _add_ratios(row: dict) -> None:
    cols = row["columns"]
    row["vs_gloo"] = _ratio(cols["gloo"], cols["pycollective"])
    mpi = cols["openmpi_in_place"] or cols["openmpi"]
    row["vs_openmpi"] = _ratio(mpi, cols["pycollective"])
    row["vs_deepspeed"] = _ratio(cols["deepspeed"], cols["pycollective"])
    row["shared_vs_openmpi"] = _ratio(mpi, cols["pycollective_shared"])
    if row["collective"] == "all_reduce":
        row["vs_openmpi_out_of_place"] = _ratio(cols["openmpi"], cols["pycollective"])


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """The first run's rows with each cell's time the median over the runs (busbw and
    algbw scaled to it) and the ratios taken again: one noisy run then cannot decide a
    goal. A cell missing or failed in some run keeps the first run's value."""
    if len(runs) == 1:
        return runs[0]
    times: dict[tuple, list[float]] = {}
    for run_rows in runs:
        for row in run_rows:
            for column, c in row["columns"].items():
                if c and "time_us" in c:
                    key = (row["job"], row["collective"], row["bytes"], column)
                    times.setdefault(key, []).append(c["time_us"])
    out = []
    for row in runs[0]:
        row = {**row, "columns": dict(row["columns"])}
        for column, c in row["columns"].items():
            got = times.get((row["job"], row["collective"], row["bytes"], column), [])
            if not c or "time_us" not in c or len(got) < len(runs):
                continue
            median = statistics.median(got)
            scale = c["time_us"] / median if median > 0 else 1.0
            row["columns"][column] = {
                **c,
                "time_us": median,
                "busbw_GBps": c["busbw_GBps"] * scale,
                "algbw_GBps": c["algbw_GBps"] * scale,
            }
        _add_ratios(row)
        out.append(row)
    return out


def _ratio(theirs: dict | None, ours: dict | None) -> float | None:
    """How many times faster ours is: their time over ours."""
    if not theirs or not ours or "time_us" not in theirs or "time_us" not in ours:
        return None
    return theirs["time_us"] / ours["time_us"] if ours["time_us"] > 0 else None


def _cell(c: dict | None, nbytes: int) -> str:
    if c is None:
        return "-"
    if "error" in c:
        return "error"
    text = fmt_time(c["time_us"])
    if nbytes >= 1 << 20:
        text += f" · {c['busbw_GBps']:.3g} GB/s"
    return text


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def markdown_table(job: Job, rows: list[dict], skipped: dict[str, str]) -> list[str]:
    columns = [
        c
        for c in COLUMNS
        if (c != "deepspeed" or job.deepspeed) and (c != "pycollective_shared" or job.shared)
    ]
    heads = [job.headers.get(c, c) for c in columns]
    vs = " | vs DeepSpeed" if job.deepspeed else ""
    shared = " | shared vs OpenMPI" if job.shared else ""
    lines = [
        f"**{job.title}**",
        "",
        "| collective | size | " + " | ".join(heads) + f" | vs gloo | vs OpenMPI{vs}{shared} |",
        "|---|--:|"
        + "--:|" * len(columns)
        + "--:|--:|"
        + ("--:|" if vs else "")
        + ("--:|" if shared else ""),
    ]
    for row in rows:
        cells = [_cell(row["columns"][c], row["bytes"]) for c in columns]
        ours = row["columns"]["pycollective"]
        if job.ours == "tcp" and ours and ours.get("ran"):
            cells[0] += f" ({ours['ran']})"  # the algorithm auto chose
        lines.append(
            f"| {row['collective']} | {human(row['bytes'])} | "
            + " | ".join(cells)
            + f" | {_x(row['vs_gloo'])} | {_x(row['vs_openmpi'])} |"
            + (f" {_x(row['vs_deepspeed'])} |" if vs else "")
            + (f" {_x(row['shared_vs_openmpi'])} |" if shared else "")
        )
    for backend, why in skipped.items():
        lines.append(f"\n{backend} left out: {why}")
    return lines


def start_stress(cpus: int) -> subprocess.Popen | None:
    """`stress-ng --cpu CPUS` in a session of its own (stopped by stop_stress), or None."""
    if cpus <= 0:
        return None
    if shutil.which("stress-ng") is None:
        raise SystemExit("compare_peers: --stress needs stress-ng (apt-get install stress-ng)")
    proc = subprocess.Popen(
        ["stress-ng", "--cpu", str(cpus), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    print(f"# stress-ng --cpu {cpus} beside the jobs", flush=True)
    time.sleep(5)  # let the load average see it
    return proc


def stop_stress(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ----------------------------------------------------------------------------- cross-host


def run_crosshost(
    jobs: list[Job], backends: list[str], mpirun: str | None, args: argparse.Namespace
) -> list[dict]:
    """Each cross-host job --xhost-runs times (alternating) on one pair of namespace hosts,
    one stream's goodput between them measured right before every job run."""
    results = []
    _crosshost.nethosts.cleanup()  # namespaces of earlier runs that were killed
    with _crosshost.nethosts.NetHosts(_crosshost.HOSTS) as hosts:
        for run in range(args.xhost_runs):
            for job in jobs:
                load = os.getloadavg()[0]
                goodput = _crosshost.link_goodput(hosts)
                duplex = _crosshost.duplex_goodput(hosts)
                print(
                    f"# {job.name} run {run + 1}/{args.xhost_runs}: one stream "
                    + ", ".join(f"{k} {v * 8 / 1e9:.2f} Gbit/s" for k, v in goodput.items())
                    + f", both ways at once {duplex * 8 / 1e9:.2f} Gbit/s each, load {load:.2f}",
                    flush=True,
                )
                res = run_job(job, [job.ours, *backends], mpirun, args, hosts)
                res.update(
                    run=run, goodput_Bps=goodput, duplex_Bps=duplex,
                    load=[load, os.getloadavg()[0]],
                )  # fmt: skip
                results.append(res)
    return results


def crosshost_rows(job: Job, results: list[dict]) -> list[dict]:
    """One row per size over the job's runs: each run's row (build_rows, plus the link
    shares), and the spread of every time, ratio and share."""
    per_size: dict[int, list[dict]] = {}
    for res in results:
        if res["name"] != job.name:
            continue
        goodput = statistics.mean(res["goodput_Bps"].values())
        for row in build_rows(job, res):
            row["run"] = res["run"]
            row["load"] = res["load"]
            row["goodput_Bps"] = goodput
            for col in ("pycollective", "gloo", "openmpi_in_place"):
                c = row["columns"][col]
                row[f"share_{col}"] = (
                    _crosshost.link_share(c["time_us"], row["bytes"], goodput)
                    if c and "time_us" in c
                    else None
                )
            per_size.setdefault(row["bytes"], []).append(row)

    def spread_of(runs: list[dict], get: Callable[[dict], float | None]) -> dict | None:
        return _crosshost.spread([v for v in map(get, runs) if v is not None])

    def time_of(col: str) -> Callable[[dict], float | None]:
        return lambda r: (r["columns"][col] or {}).get("time_us")

    out = []
    for nbytes, runs in sorted(per_size.items()):
        out.append(
            {
                "job": job.name,
                "collective": "all_reduce",
                "bytes": nbytes,
                "ranks": job.ranks,
                "per_host": job.per_host,
                "runs": runs,
                "time_us": {c: spread_of(runs, time_of(c)) for c in COLUMNS if c != "deepspeed"},
                "vs_gloo": spread_of(runs, lambda r: r["vs_gloo"]),
                "vs_openmpi": spread_of(runs, lambda r: r["vs_openmpi"]),
                "share": {
                    c: spread_of(runs, lambda r, c=c: r[f"share_{c}"])
                    for c in ("pycollective", "gloo", "openmpi_in_place")
                },
            }
        )
    return out


def spread_rows(runs: list[list[dict]]) -> list[dict]:
    """For each (job, collective, size, column) measured in every run: the runs' times
    (each a run's median), their min / median / max, and max over min."""
    cells: dict[tuple, list[float]] = {}
    for run_rows in runs:
        for row in run_rows:
            for column, c in row["columns"].items():
                if c and "time_us" in c:
                    key = (row["job"], row["collective"], row["bytes"], column)
                    cells.setdefault(key, []).append(c["time_us"])
    out = []
    for (job, collective, nbytes, column), times in cells.items():
        if len(times) < len(runs):
            continue  # failed in some run: no spread to speak of
        out.append(
            {
                "job": job,
                "collective": collective,
                "bytes": nbytes,
                "column": column,
                "times_us": times,
                "min_us": min(times),
                "median_us": statistics.median(times),
                "max_us": max(times),
                "max_over_min": max(times) / min(times) if min(times) > 0 else None,
            }
        )
    return out


def markdown_crosshost(job: Job, rows: list[dict], results: list[dict]) -> list[str]:
    mine = [r for r in results if r["name"] == job.name]
    streams = [v * 8 / 1e9 for r in mine for v in r["goodput_Bps"].values()]
    duplex = [
        r["duplex_Bps"] / statistics.mean(r["goodput_Bps"].values())
        for r in mine
        if r.get("duplex_Bps")
    ]
    loads = [x for r in mine for x in r["load"]]
    lines = [
        f"**{job.title}**",
        "",
        f"{len(mine)} run(s) of the whole job; one TCP stream between the hosts "
        + (f"{min(streams):.3g}-{max(streams):.3g} Gbit/s" if streams else "not measured")
        + (f", load {min(loads):.2f}-{max(loads):.2f}" if loads else "")
        + (
            f"; the two hosts exchanging both ways at once carry {min(duplex):.2f}-"
            f"{max(duplex):.2f} of it each way with plain sockets (an all-reduce's link "
            "does that; on one machine's cores, not a wire)"
            if duplex
            else ""
        )
        + ". Started by `mpirun --bind-to none` through an `ip netns exec` agent. Times: "
        "median over the runs of each run's median; ratios and shares: median (min-max) "
        "over the runs; share = link busbw (n / t) over the stream's goodput.",
        "",
        "| size | pycollective | gloo | OpenMPI in place | vs gloo | vs OpenMPI | "
        "ours / stream | gloo / stream | OpenMPI / stream |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        t = row["time_us"]
        cells = [
            fmt_time(t[c]["median"]) if t[c] else "-"
            for c in ("pycollective", "gloo", "openmpi_in_place")
        ]
        shares = [
            _crosshost.fmt_spread(row["share"][c])
            for c in ("pycollective", "gloo", "openmpi_in_place")
        ]
        lines.append(
            f"| {human(row['bytes'])} | "
            + " | ".join(cells)
            + f" | {_crosshost.fmt_spread(row['vs_gloo'], '{:.2f}x')}"
            + f" | {_crosshost.fmt_spread(row['vs_openmpi'], '{:.2f}x')} | "
            + (" | ".join(shares) if row["bytes"] >= 1 << 20 else "- | - | -")
            + " |"
        )
    for res in mine:
        if "error" in res:
            lines.append(f"\n(run {res['run'] + 1} failed: {res['error'].splitlines()[0]})")
    return lines


def crosshost_targets(rows: list[dict]) -> list[dict]:
    """Issue 20's cross-host goals, on the median over the runs."""
    out = []
    for per_host in (1, 2):
        mine = [r for r in rows if r.get("per_host") == per_host]
        if not mine:
            continue
        where = f"2 hosts x {per_host}"
        for size in (1 << 20, 16 << 20, 64 << 20):
            r = next((r for r in mine if r["bytes"] == size), None)
            v = r["vs_gloo"]["median"] if r and r["vs_gloo"] else None
            out.append(_goal(f"{where}: all_reduce {human(size)} vs gloo", v, 1.5))
        vals = [(r["vs_openmpi"]["median"], r["bytes"]) for r in mine if r["vs_openmpi"]]
        worst = min(vals) if vals else None
        out.append(
            _goal(
                f"{where}: all_reduce, every size vs OpenMPI"
                + (f" (worst: {human(worst[1])})" if worst else ""),
                worst[0] if worst else None,
                1.0,
            )
        )
        r = next((r for r in mine if r["bytes"] == 64 << 20), None)
        share = r["share"]["pycollective"] if r else None
        out.append(
            _goal(f"{where}: 64 MiB link busbw / one stream", share and share["median"], 0.6)
        )
    return out


def _goal(text: str, value: float | None, need: float) -> dict:
    met = None if value is None else value >= need
    return {"goal": text, "value": value, "need": need, "met": met}


def markdown_spread(spread: list[dict], runs: int) -> list[str]:
    lines = [
        f"**Spread over {runs} runs of the whole job** (each run's median time per call; "
        "new processes every run)",
        "",
        "| job | collective | size | library | min | median | max | max/min |",
        "|---|---|--:|---|--:|--:|--:|--:|",
    ]
    for r in spread:
        ratio = "-" if r["max_over_min"] is None else f"{r['max_over_min']:.2f}"
        lines.append(
            f"| {r['job']} | {r['collective']} | {human(r['bytes'])} | {r['column']} | "
            f"{fmt_time(r['min_us'])} | {fmt_time(r['median_us'])} | {fmt_time(r['max_us'])} "
            f"| {ratio} |"
        )
    return lines


# ----------------------------------------------------------------------------- targets


def targets(rows: list[dict], big: int, crowded: int) -> list[dict]:
    """Issue 11's goals, read off the rows (None where a number is missing). A goal over a
    range of sizes is met if it is met at every size of the range: the worst size's ratio
    is the one shown, with that size."""

    def rows_of(job: str, coll: str) -> list[dict]:
        return sorted(
            (r for r in rows if r["job"] == job and r["collective"] == coll),
            key=lambda r: r["bytes"],
        )

    out = []

    def goal(text: str, cands: list[dict], key: str, need: float) -> None:
        values = [(r[key], r["bytes"]) for r in cands if r.get(key) is not None]
        if not values:
            out.append({"goal": text, "value": None, "need": need, "met": None})
            return
        worst, at = min(values)
        label = text if len(values) == 1 else f"{text} (worst: {human(at)})"
        out.append({"goal": label, "value": worst, "need": need, "met": worst >= need})

    ar = rows_of("shm", "all_reduce")
    goal(
        "all_reduce 4 B-16 KiB vs OpenMPI",
        [r for r in ar if r["bytes"] <= 16 << 10],
        "vs_openmpi",
        0.5,
    )
    goal(
        "all_reduce 64 KiB-1 MiB vs OpenMPI",
        [r for r in ar if 64 << 10 <= r["bytes"] <= 1 << 20],
        "vs_openmpi",
        1.0,
    )
    goal(
        "all_reduce 4 MiB and up vs OpenMPI",
        [r for r in ar if r["bytes"] >= 4 << 20],
        "vs_openmpi",
        1.5,
    )
    goal(
        "all_reduce 1, 4, 16 MiB vs OpenMPI (issue 20)",
        [r for r in ar if r["bytes"] in (1 << 20, 4 << 20, 16 << 20)],
        "vs_openmpi",
        1.5,
    )
    goal(
        "all_reduce 1, 4, 16 MiB on shared buffers vs OpenMPI",
        [r for r in ar if r["bytes"] in (1 << 20, 4 << 20, 16 << 20)],
        "shared_vs_openmpi",
        1.5,
    )
    goal(
        "all_reduce 64 KiB and up vs DeepSpeed",
        [r for r in ar if r["bytes"] >= 64 << 10],
        "vs_deepspeed",
        1.0,
    )
    b = human(big)
    for coll, need in (("broadcast", 1.0), ("all_gather", 1.0), ("reduce_scatter", 2.0)):
        goal(
            f"{coll} {b} vs OpenMPI",
            [r for r in rows_of("shm", coll) if r["bytes"] == big],
            "vs_openmpi",
            need,
        )
    cr = rows_of("crowded", "all_reduce")
    if cr:
        goal(
            f"{crowded} ranks, all_reduce {human(cr[0]['bytes'])} vs OpenMPI",
            cr[:1],
            "vs_openmpi",
            0.33,
        )
        goal(
            f"{crowded} ranks, all_reduce {human(cr[-1]['bytes'])} vs OpenMPI",
            cr[-1:],
            "vs_openmpi",
            1.0,
        )
    tcp = rows_of("tcp", "all_reduce")
    goal(
        f"TCP all_reduce {human(tcp[0]['bytes']) if tcp else '4 B'} vs OpenMPI over TCP",
        tcp[:1],
        "vs_openmpi",
        0.33,
    )
    goal(f"TCP all_reduce {b} vs gloo", [r for r in tcp if r["bytes"] == big], "vs_gloo", 1.5)
    return out


def markdown_targets(goals: list[dict]) -> list[str]:
    lines = ["| goal (issues 11, 20) | measured | needed | met |", "|---|--:|--:|:-:|"]
    for g in goals:
        value = "-" if g["value"] is None else f"{g['value']:.3g}x"
        need = f">= {g['need']:g}x"
        met = {True: "yes", False: "**no**", None: "-"}[g["met"]]
        lines.append(f"| {g['goal']} | {value} | {need} | {met} |")
    return lines


# ----------------------------------------------------------------------------- machine


def machine_facts() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for pkg in ("numpy", "torch", "mpi4py"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        **versions,
        "commit": commit or None,
    }


# ----------------------------------------------------------------------------- main


def plan_jobs(args: argparse.Namespace) -> list[Job]:
    sweep = sizes(args.min_bytes, args.max_bytes, args.factor)
    if args.big not in sweep:
        sweep.append(args.big)
    n = args.nprocs
    jobs = {
        "shm": Job(
            "shm",
            f"One host, {n} ranks: pycollective auto (shared memory), gloo, OpenMPI",
            n,
            [
                ("all_reduce", sweep),
                ("broadcast", [args.big]),
                ("all_gather", [args.big]),
                ("reduce_scatter", [args.big]),
            ],
            "shm",
            headers={
                "openmpi_in_place": "OpenMPI in place",
                "pycollective_shared": "pycollective, shared buffers",
            },
            shared=True,
        ),
        "tcp": Job(
            "tcp",
            f"TCP only, {n} ranks: PYCOLLECTIVE_TRANSPORT=tcp, gloo, OpenMPI --mca btl tcp,self",
            n,
            [("all_reduce", sweep)],
            "tcp",
            env={"PYCOLLECTIVE_TRANSPORT": "tcp"},
            mpi_args=(
                "--mca",
                "pml",
                "ob1",
                "--mca",
                "btl",
                "tcp,self",
                "--mca",
                "btl_tcp_if_include",
                "lo",
            ),
            headers={
                "pycollective": "pycollective tcp",
                "openmpi": "OpenMPI tcp",
                "openmpi_in_place": "OpenMPI tcp in place",
            },
        ),
        "crowded": Job(
            "crowded",
            f"{args.crowded} ranks on {os.cpu_count()} cores: pycollective auto, "
            "gloo, OpenMPI (--oversubscribe)",
            args.crowded,
            [("all_reduce", sorted(args.crowded_sizes))],
            "shm",
            headers={"openmpi_in_place": "OpenMPI in place"},
        ),
    }
    for per_host in (1, 2):
        jobs[f"xhost{per_host}"] = Job(
            f"xhost{per_host}",
            f"Across 2 namespace hosts x {per_host} rank(s): pycollective auto (TCP between "
            "the hosts), gloo, OpenMPI (btl tcp between the hosts)",
            _crosshost.HOSTS * per_host,
            [("all_reduce", sweep)],
            "auto",
            headers={"openmpi_in_place": "OpenMPI in place"},
            per_host=per_host,
        )
    keep = set(args.collectives.split(","))
    for job in jobs.values():
        job.plan = [(c, s) for c, s in job.plan if c in keep]
    for job in jobs.values():
        job.headers = {
            "pycollective": "pycollective",
            "gloo": "gloo",
            "openmpi": "OpenMPI",
            "deepspeed": "DeepSpeed",
            **job.headers,
        }
    wanted = []
    for name in args.jobs.split(","):  # "xhost" is both cross-host jobs
        wanted += ["xhost1", "xhost2"] if name == "xhost" else [name]
    unknown = set(wanted) - set(jobs)
    if unknown:
        raise SystemExit(f"compare_peers: unknown job(s) {sorted(unknown)}; use {list(jobs)}")
    if args.crowded < 2 and "crowded" in wanted:
        wanted.remove("crowded")
    return [jobs[name] for name in wanted]


def _sizes_list(text: str) -> list[int]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nprocs", type=int, default=2, help="ranks of the shm and tcp jobs")
    p.add_argument(
        "--crowded",
        type=int,
        default=4,
        help="ranks of the crowded job (default 4; 0 leaves it out)",
    )
    p.add_argument(
        "--crowded-sizes",
        type=_sizes_list,
        default=[4, 16 << 20],
        help="all_reduce sizes of the crowded job (default 4,16M)",
    )
    p.add_argument("-b", "--min-bytes", type=parse_size, default=4)
    p.add_argument("-e", "--max-bytes", type=parse_size, default=64 << 20)
    p.add_argument("-f", "--factor", type=int, default=4, help="all_reduce size step")
    p.add_argument(
        "--big",
        type=parse_size,
        default=64 << 20,
        help="size of broadcast, all_gather, reduce_scatter (default 64M)",
    )
    p.add_argument(
        "--jobs",
        default="shm,tcp,crowded,xhost",
        help="of shm, tcp, crowded, xhost (= xhost1,xhost2: 2 hosts x 1 and x 2 ranks)",
    )
    p.add_argument(
        "--xhost-runs",
        type=int,
        default=3,
        help="runs of each cross-host job, for the spread (the issue's numbers: >= 10)",
    )
    p.add_argument(
        "--collectives",
        default="all_reduce,broadcast,all_gather,reduce_scatter",
        help="which collectives the jobs measure (default all four)",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=1,
        help="run every job this many times (new processes each time) and print the spread "
        "of each cell over the runs: min / median / max of the runs' medians, max/min",
    )
    p.add_argument("--reps", type=int, default=21, help="most repetitions per size")
    p.add_argument("--min-reps", type=int, default=11, help="fewest repetitions (default 11)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--budget",
        type=float,
        default=3.0,
        help="seconds of repetitions per size, all libraries (beyond --min-reps)",
    )
    p.add_argument("--timeout", type=float, default=1200.0, help="per job, seconds")
    p.add_argument(
        "--stress",
        type=int,
        default=0,
        metavar="CPUS",
        help="run `stress-ng --cpu CPUS` beside every job (load for all libraries alike)",
    )
    p.add_argument("--json", default=str(DEFAULT_JSON), help="where the JSON goes")
    p.add_argument("--markdown", metavar="FILE", help="also write the tables here")
    p.add_argument(
        "--readme",
        metavar="FILE",
        help=f"put the tables into FILE between {BEGIN} and {END} (e.g. README.md)",
    )
    p.add_argument(
        "--no-install",
        action="store_true",
        help="never install OpenMPI or mpi4py; leave their columns out instead",
    )
    p.add_argument("--no-openmpi", action="store_true", help="leave OpenMPI out")
    p.add_argument(
        "--no-deepspeed",
        action="store_true",
        help="leave DeepSpeed out (else its venv is built under benchmarks/ when missing)",
    )
    p.add_argument(
        "--mpirun-args",
        default="",
        help="more mpirun options, e.g. '--bind-to none' (default: mpirun's own defaults)",
    )
    args = p.parse_args(argv)
    if args.nprocs < 2 or args.factor < 2 or args.min_bytes > args.max_bytes or args.runs < 1:
        p.error("need -n >= 2, -f >= 2, -b <= -e and --runs >= 1")
    return args


BEGIN, END = "<!-- compare_peers: begin -->", "<!-- compare_peers: end -->"


def replace_block(path: Path, text: str) -> None:
    """Put `text` between the BEGIN and END markers of `path` (a README)."""
    doc = path.read_text()
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):
        raise SystemExit(f"compare_peers: {path} needs one {BEGIN} ... {END} block")
    head, rest = doc.split(BEGIN)
    _, tail = rest.split(END)
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    jobs = plan_jobs(args)
    skipped: dict[str, str] = {}
    mpirun = None
    if args.no_openmpi:
        skipped["openmpi"] = "--no-openmpi"
    else:
        mpirun, why = ensure_openmpi(not args.no_install)
        if why:
            skipped["openmpi"] = why
    why = gloo_missing()
    if why:
        skipped["gloo"] = why
    if args.no_deepspeed:
        skipped["deepspeed"] = "--no-deepspeed"
    elif "gloo" in skipped:
        skipped["deepspeed"] = "it joins gloo's torch.distributed group, and gloo is left out"
    else:
        _, why = _deepspeed.ensure(not args.no_install)
        if why:
            skipped["deepspeed"] = why
    for name, reason in skipped.items():
        print(f"# {name} left out: {reason}", flush=True)
    backends_all = [b for b in ("gloo", "openmpi") if b not in skipped]
    for job in jobs:  # DeepSpeed's shm all-reduce: the shared-memory job (p ranks, p cores)
        job.deepspeed = job.name == "shm" and "deepspeed" not in skipped

    xjobs = [j for j in jobs if j.per_host]
    jobs = [j for j in jobs if not j.per_host]
    if xjobs:
        why = _crosshost.why_not(mpirun)
        if why:
            print(f"# cross-host job left out: {why}", flush=True)
            skipped["cross-host job"] = why
            xjobs = []

    stress = start_stress(args.stress)
    load_before = os.getloadavg()
    sampler = LoadSampler()
    limits = numpy_limits(args.big, 11)
    results, rows, xresults, xrows = [], [], [], []
    runs: list[list[dict]] = []  # each run's rows (the first run's are `rows`)
    try:
        for run in range(args.runs):
            if args.runs > 1:
                print(f"# run {run + 1} of {args.runs}", flush=True)
            run_rows: list[dict] = []
            for job in jobs:
                extra = (["shm_shared"] if job.shared else []) + (
                    ["deepspeed"] if job.deepspeed else []
                )
                res = run_job(job, [job.ours, *backends_all, *extra], mpirun, args)
                res["skipped"] = skipped
                if run == 0 or "error" in res:
                    results.append(res)  # a failed later run is reported too
                run_rows += build_rows(job, res)
            runs.append(run_rows)
        rows = median_rows(runs) if runs else []
        if xjobs:
            xresults = run_crosshost(xjobs, backends_all, mpirun, args)
            for job in xjobs:
                xrows += crosshost_rows(job, xresults)
    finally:
        during = sampler.stop()
        stop_stress(stress)
    load_after = os.getloadavg()

    goals = (targets(rows, args.big, args.crowded) if jobs else []) + crosshost_targets(xrows)
    facts = machine_facts()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mpi_lib = next(
        (r["meta"].get("mpi_library") for r in results if r["meta"].get("mpi_library")), None
    )
    ds_lib = next((r["meta"].get("deepspeed") for r in results if r["meta"].get("deepspeed")), None)
    md = [
        f"Measured {when} on {facts['cores']} cores ({facts['cpu'] or 'unknown CPU'}), "
        f"1-minute load average {load_before[0]:.2f} before, {min(during):.2f} to "
        f"{max(during):.2f} during the run (its own ranks add about 2"
        + (f"; stress-ng --cpu {args.stress} beside them" if args.stress else "")
        + f"), {load_after[0]:.2f} after; "
        f"float32, median of >= {args.min_reps} repetitions"
        + (f" (cells: the median of {args.runs} runs' medians)" if args.runs > 1 else "")
        + f"; torch {facts['torch']} (gloo), "
        f"{mpi_lib or 'OpenMPI not measured'}, mpi4py {facts['mpi4py']}"
        + (
            f", {ds_lib} (torch.ops.deepspeed.inference_all_reduce_, DS_ACCELERATOR=cpu)"
            if ds_lib
            else ""
        )
        + "; commit "
        f"{facts['commit']}.",
        f"One core of numpy: memcpy {limits['memcpy_GBps']:.3g} GB/s, add "
        f"{limits['add_GBps']:.3g} GB/s ({human(limits['bytes'])} float32).",
        "Cells: time per call · busbw; vs = how many times faster pycollective is "
        "(against OpenMPI's in-place all_reduce).",
        "The libraries take turns in the same ranks, started by "
        + (f"`{f'mpirun {args.mpirun_args}'.strip()}`" if mpirun else "`pycollective run`")
        + (" (its default binding)" if mpirun and not args.mpirun_args else "")
        + "; regenerate with `make compare`.",
        "",
    ]
    by_name = {j.name: j for j in jobs}
    for res in results:
        job = by_name[res["name"]]
        md += markdown_table(job, [r for r in rows if r["job"] == job.name], {})
        if "error" in res:
            md.append(f"\n(job failed: {res['error'].splitlines()[0]})")
        md.append("")
    for job in xjobs:
        md += markdown_crosshost(job, [r for r in xrows if r["job"] == job.name], xresults)
        md.append("")
    for backend, reason in skipped.items():
        md.append(f"{backend} left out: {reason}")
    spread = spread_rows(runs) if len(runs) > 1 else []
    if spread:
        md += ["", *markdown_spread(spread, len(runs))]
    md += ["", *markdown_targets(goals)]
    text = "\n".join(md)
    print("\n" + text, flush=True)

    out = {
        "format": "pycollective-compare-peers/1",
        "when": when,
        "machine": facts,
        "load_average": {"before": load_before, "during_1min": during, "after": load_after},
        "numpy_one_core": limits,
        "mpi_library": mpi_lib,
        "deepspeed": ds_lib,
        "settings": {
            k: v for k, v in vars(args).items() if k not in ("json", "markdown", "readme")
        },
        "columns": list(COLUMNS),
        "skipped": skipped,
        "jobs": results,
        "rows": rows,
        "crosshost_jobs": xresults,
        "crosshost_rows": xrows,
        "later_runs": runs[1:],
        "spread": spread,
        "targets": goals,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"# JSON: {args.json}")
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
        print(f"# markdown: {args.markdown}")
    if args.readme:
        replace_block(Path(args.readme), text)
        print(f"# tables put into {args.readme}")
    return 1 if any("error" in r for r in results + xresults) else 0


if __name__ == "__main__":
    sys.exit(main())
