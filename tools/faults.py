"""Fault injection for pycollective (`make faults`): kills, mismatches, fuzzing, a soak,
SIGINT, the flight recorder's cost, the launcher's notice window, elastic recovery, and
elastic training across namespace hosts on etcd losing whole hosts (root; etcd).
Prints what it found and writes it as JSON.

    python tools/faults.py [--kills 50] [--fuzz-seconds 120] [--soak-small 100000]
                           [--soak-large 1000] [--launcher-runs 20] [--elastic-kills 20]
                           [--attack-rounds 3] [--attack-flood 2000]
                           [--host-kills 20] [--host-cuts 10] [--member-losses 3]
                           [--per-host 2,1,2,1]
                           [--only kill,mismatch,fuzz,soak,sigint,overhead,launcher,elastic,
                                   attacks,hosts]

Exit status 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "src")]

from fuzz import TARGETS, native  # noqa: E402
from fuzz import run as fuzz_run  # noqa: E402
from tests._launch import run_ranks  # noqa: E402
from tests.cli.test_launch_failures import check_lost_rank  # noqa: E402
from tests.elastic._harness import kills_in_a_row  # noqa: E402
from tests.faults._chaos import kill_run, sigint_run  # noqa: E402
from tests.faults.test_faults import MORE_SIDES, SEND_ONLY_POSSIBLE, SIDES  # noqa: E402

TRANSPORTS = {"tcp": {"PYCOLLECTIVE_TRANSPORT": "tcp"}, "auto": {}}


def log(text: str) -> None:
    print(text, flush=True)


# ---------------------------------------------------------------------- kill -9


def kills(n: int, transports: list[str], seed: int) -> dict:
    rng = random.Random(seed)
    runs, failures, worst = [], [], 0.0
    for i in range(n):
        nprocs = 3 if i % 2 == 0 else 4
        transport = transports[(i // 2) % len(transports)]
        victim = rng.randrange(nprocs)
        delay = rng.uniform(0.05, 1.5)
        res = kill_run(nprocs, seed * 1000 + i, delay, victim, env=TRANSPORTS[transport])
        t = max(res.raise_seconds.values(), default=float("nan"))
        worst = max(worst, t) if res.raise_seconds else worst
        runs.append(
            {
                "run": i,
                "nprocs": nprocs,
                "transport": transport,
                "victim": victim,
                "delay": round(delay, 3),
                "launcher_rc": res.launcher_rc,
                "max_raise_s": round(t, 4),
                "ok": res.ok,
                "problems": res.problems,
            }
        )
        log(
            f"  kill {i + 1:2d}/{n}: {transport:4s} p={nprocs} victim={victim} "
            f"after {delay:.2f} s -> survivors raised within {t:.3f} s, launcher rc "
            f"{res.launcher_rc}{'' if res.ok else '  PROBLEMS: ' + '; '.join(res.problems)}"
        )
        if not res.ok:
            failures.append(runs[-1] | {"stderr": res.stderr_tail})
    survivors = sum(r["nprocs"] - 1 for r in runs)
    return {
        "runs": n,
        "kills": n,
        "survivors": survivors,
        "failed_runs": len(failures),
        "max_raise_seconds": round(worst, 4),
        "transports": transports,
        "world_sizes": [3, 4],
        "details": runs,
        "failures": failures,
    }


# ---------------------------------------------------------------------- mismatches


def _steps(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            d = json.loads(line[7:])
            out[d["step"]] = d
    return out


def mismatches(sizes: list[int]) -> dict:
    worker = REPO / "tests" / "faults" / "_worker.py"
    kinds_ok, problems = set(), []
    for variant, (mine, theirs) in SIDES.items():
        ok = True
        for p in sizes:
            results = run_ranks(
                worker, p, ("mismatch", variant), env={"PYCOLLECTIVE_TIMEOUT": "10"}, timeout=60
            )
            for r in results:
                s = _steps(r.stdout)
                order = ["extra", "mismatch", "after"]
                failed = [s[k] for k in order if k in s and s[k]["error"]]
                bad = None
                if r.returncode != 0:
                    bad = f"exit {r.returncode}: {r.stderr[-300:]}"
                elif not failed:
                    bad = "no error"
                elif failed[0]["error"] != "MismatchError":
                    bad = f"{failed[0]['error']}: {failed[0]['msg'][:200]}"
                elif not (mine in failed[0]["msg"] and theirs in failed[0]["msg"]):
                    bad = f"does not name both sides: {failed[0]['msg'][:200]}"
                elif (
                    variant not in SEND_ONLY_POSSIBLE
                    and variant != "extra"
                    and not (s.get("mismatch", {}).get("error"))
                ):
                    bad = "the mismatched call itself did not raise"
                elif failed[0]["elapsed"] > 5:
                    bad = f"took {failed[0]['elapsed']:.1f} s"
                if bad:
                    ok = False
                    problems.append(f"{variant} p={p} rank {r.rank}: {bad}")
        if ok:
            kinds_ok.add(variant)
        log(f"  mismatch {variant:18s} at p={sizes}: {'ok' if ok else 'FAILED'}")
    return {
        "kinds": len(SIDES),
        "kinds_ok": len(kinds_ok),
        "world_sizes": sizes,
        "variants": sorted(SIDES),
        "more": sorted(MORE_SIDES),
        "problems": problems,
    }


# ---------------------------------------------------------------------- fuzzing


def fuzz(seconds: float) -> dict:
    """Every target of fuzz/ for `seconds` (arena_words against the compiled core built
    for coverage and AddressSanitizer, when clang is here), then the store attacks of
    tests/security/test_fuzz_wire.py beside a live job."""
    out = REPO / "out" / "fuzz"
    env = None
    if shutil.which("clang"):
        env = native.environment(native.build(out / "native"))
    else:
        log("  no clang: arena_words runs on the ordinary build (make system-deps installs it)")
    targets = {}
    for target in TARGETS:
        r = fuzz_run.run(target, seconds, out / target, env if target == "arena_words" else None)
        log("  " + fuzz_run.report(r).splitlines()[0])
        targets[target] = {
            "ok": r.ok,
            "inputs": r.runs,
            "seconds": r.seconds,
            "per_second": round(r.per_second),
            "artifact": r.artifact,
            "asan": bool(env) and target == "arena_words",
        }
        if not r.ok:
            targets[target]["output"] = r.output[-3000:]
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        report = f.name
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:logging", "-p", "no:cacheprovider",
         "--timeout", "600", "tests/security/test_fuzz_wire.py"],
        cwd=REPO,
        env=dict(os.environ, PYCOLLECTIVE_FUZZ_REPORT=report),
        capture_output=True,
        text=True,
    )  # fmt: skip
    try:
        data = json.loads(Path(report).read_text())
    except (OSError, ValueError):
        data = {}
    finally:
        Path(report).unlink(missing_ok=True)
    tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    log(f"  beside a live job: {data.get('inputs', 0)} inputs in {time.monotonic() - t0:.0f} s")
    return {
        "ok": proc.returncode == 0 and all(t["ok"] for t in targets.values()),
        "inputs": sum(t["inputs"] for t in targets.values()),
        "targets": targets,
        "side_job": data.get("side_job"),
        "rss_growth_bytes": data.get("rss_growth_bytes"),
        "pytest": proc.stdout[-3000:] if proc.returncode else tail,
    }


# ---------------------------------------------------------------------- attacks


def attacks(rounds: int, flood: int) -> dict:
    """The attack suite (tests/security) `rounds` times over, its floods `flood` strong."""
    env = dict(os.environ, PYCOLLECTIVE_ATTACK_FLOOD=str(flood))
    runs = []
    for i in range(rounds):
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout",
             "900", "tests/security"],
            cwd=REPO, env=env, capture_output=True, text=True,
        )  # fmt: skip
        tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
        log(f"  attacks {i + 1}/{rounds}: {tail} in {time.monotonic() - t0:.0f} s")
        runs.append({"ok": proc.returncode == 0, "summary": tail,
                     "failures": proc.stdout[-3000:] if proc.returncode else ""})  # fmt: skip
    return {"rounds": rounds, "flood": flood, "ok": all(r["ok"] for r in runs), "runs": runs}


# ---------------------------------------------------------------------- soak


def soak(small: int, large: int, nprocs: int = 2) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pycollective",
            "run",
            "-n",
            str(nprocs),
            sys.executable,
            str(REPO / "tests" / "faults" / "_soak_worker.py"),
            str(small),
            str(large),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)])),
    )
    ranks = [json.loads(m[1]) for m in re.finditer(r"SOAK (\{.*\})", proc.stdout)]
    problems = []
    if proc.returncode != 0 or len(ranks) != nprocs:
        problems.append(f"exit {proc.returncode}: {proc.stderr[-1000:]}")
    for r in ranks:
        if r["rss_growth_pct"] >= 5.0:
            problems.append(f"rank {r['rank']}: RSS grew {r['rss_growth_pct']:.2f}%")
        if r["after"]["fds"] > r["before"]["fds"]:
            problems.append(f"rank {r['rank']}: fds {r['before']['fds']} -> {r['after']['fds']}")
        if r["after"]["threads"] > r["before"]["threads"]:
            problems.append(f"rank {r['rank']}: threads grew")
        log(
            f"  soak rank {r['rank']}: {small} small + {large} large all_reduce in "
            f"{r['seconds']:.1f} s; RSS {r['before']['rss'] >> 10} -> {r['after']['rss'] >> 10}"
            f" KiB ({r['rss_growth_pct']:+.2f}%), fds {r['before']['fds']} -> "
            f"{r['after']['fds']}, threads {r['before']['threads']} -> {r['after']['threads']}"
        )
    return {
        "ok": not problems,
        "small": small,
        "large": large,
        "nprocs": nprocs,
        "ranks": ranks,
        "problems": problems,
        "seconds": time.monotonic() - t0,
    }


# ---------------------------------------------------------------------- SIGINT


def sigints(n: int, seed: int) -> dict:
    rng = random.Random(seed)
    runs = []
    for i in range(n):
        nprocs = 3 if i % 2 == 0 else 4
        res = sigint_run(nprocs, seed + i, rng.uniform(0.05, 1.0))
        runs.append(
            {
                "nprocs": nprocs,
                "exit_seconds": res.exit_seconds,
                "ok": res.ok,
                "problems": res.problems,
            }
        )
        log(
            f"  sigint {i + 1}/{n}: p={nprocs}: every rank gone {res.exit_seconds:.2f} s after "
            f"SIGINT{'' if res.ok else '  PROBLEMS: ' + '; '.join(res.problems)}"
        )
    return {
        "runs": n,
        "failed_runs": sum(not r["ok"] for r in runs),
        "max_exit_seconds": max(r["exit_seconds"] or 99 for r in runs),
        "details": runs,
    }


# ---------------------------------------------------------------------- recorder cost


_BENCH = """
import time, numpy as np, pycollective as dist
dist.init_process_group()
x = np.ones(16, np.float32)
best = 1e9
for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(20000):
        dist.all_reduce(x)
    best = min(best, (time.perf_counter() - t0) / 20000)
print(best)
"""


def overhead() -> dict:
    import timeit

    from pycollective.observe.flight import FlightRecorder

    rec = FlightRecorder(0, 1)

    def one() -> None:
        e = rec.record(1, "default", 0, "all_reduce", 16, None, "ring", None, 0)
        e.start()
        e.end()

    per = min(timeit.repeat(one, number=100000, repeat=5)) / 100000
    calls = {}
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    for label, cap in (("off", "0"), ("on", "256")):
        out = subprocess.run(
            [sys.executable, "-c", _BENCH],
            capture_output=True,
            text=True,
            env=dict(env, PYCOLLECTIVE_FLIGHT_RECORDER=cap),
            cwd=REPO,
        )
        calls[label] = float(out.stdout.strip().splitlines()[-1])
    log(
        f"  recorder: {per * 1e6:.2f} us per record+start+end; world-of-one all_reduce "
        f"{calls['off'] * 1e6:.1f} us off, {calls['on'] * 1e6:.1f} us on"
    )
    return {
        "record_start_end_us": per * 1e6,
        "all_reduce_us_off": calls["off"] * 1e6,
        "all_reduce_us_on": calls["on"] * 1e6,
    }


# ---------------------------------------------------------------------- launcher, elastic


def launcher_runs(n: int, seed: int) -> dict:
    """A rank SIGKILLed in a loop of all_reduce, n times (3 and 4 ranks): every survivor
    prints its own error, once, runs its finally block, and nothing is left."""
    rng = random.Random(seed)
    failures = []
    for i in range(n):
        nprocs = 3 if i % 2 == 0 else 4
        victim, at = rng.randrange(nprocs), rng.randrange(2, 200)
        problems = check_lost_rank(nprocs, victim, at)
        if problems:
            failures.append({"run": i, "nprocs": nprocs, "victim": victim, "problems": problems})
        log(f"  run {i}: p={nprocs} victim {victim} at {at}: {'ok' if not problems else problems}")
    return {"runs": n, "failed_runs": len(failures), "failures": failures}


def _quantiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    if not xs:
        return {}
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return {"n": len(xs), "min": round(xs[0], 3), "median": round(pick(0.5), 3),
            "p90": round(pick(0.9), 3), "max": round(xs[-1], 3)}  # fmt: skip


def elastic_kills(n: int, seed: int) -> dict:
    """kill -9 n times in a row in one elastic job of 4 (tests/elastic/_harness.py)."""
    load = os.getloadavg()
    out = kills_in_a_row(n, seed, log=lambda text: log("  " + text))
    recovery = [k.recovery_s for k in out.kills if k.recovery_s is not None]
    lost = [max(0, k.committed_before - (k.resumed_step or 0)) for k in out.kills]
    # the step in flight: committed by the new round (resumed past what survivors had
    # committed) or redone (resumed where they were)
    committed = sum(1 for k in out.kills if (k.resumed_step or 0) > k.committed_before)
    return {
        "kills": n, "ok": not out.problems, "problems": out.problems[:10],
        "failures": len(out.kills), "kinds": sorted({k.kind for k in out.kills}),
        "replacements_killed_while_joining": out.joining_kills,
        "recovery_seconds": _quantiles(recovery),
        "replacement_seconds": _quantiles(out.replacement_seconds()),
        "committed_steps_lost": {"max": max(lost, default=0), "total": sum(lost)},
        "step_in_flight": {"committed": committed, "redone": len(out.kills) - committed},
        "load_before": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip


def host_runs(kills_n: int, cuts: int, members: int, per_host: list[int], seed: int) -> dict:
    """4 namespace hosts, etcd on 3 of them, one elastic job across all (tests/elastic/
    _hosts.py): etcd members lost alone, then hosts killed whole and hosts cut off then
    killed, a replacement host after each; then the quorum lost."""
    from tests import _etcd
    from tests.elastic._hosts import host_losses, quorum_loss
    from tools import nethosts

    why = nethosts.available() or _etcd.missing()
    if why:
        return {"ok": False, "problems": [f"cannot run: {why}"]}
    load = os.getloadavg()
    nethosts.cleanup()
    with (
        nethosts.NetHosts(len(per_host)) as hosts,
        _etcd.EtcdCluster(3, hosts=hosts, on=[0, 1, 2]) as etcd,
    ):
        out, extra = host_losses(hosts, etcd, kills_n, seed, per_host=per_host, cuts=cuts,
                                 member_losses=members, log=log,
                                 stderr_to=os.environ.get("FAULTS_HOSTS_STDERR"))  # fmt: skip
        load_mid = os.getloadavg()
        quorum = quorum_loss(hosts, etcd, per_host=per_host, log=log)
    by_kind: dict[str, list[float]] = {}
    leader: dict[str, list[float]] = {}
    for k, e in zip(out.kills, extra["events"], strict=True):
        if k.recovery_s is not None:
            by_kind.setdefault(k.kind, []).append(k.recovery_s)
            if e["host"] == e["leader_host"]:
                leader.setdefault(k.kind, []).append(k.recovery_s)
    lost = [max(0, k.committed_before - (k.resumed_step or 0)) for k in out.kills]
    digests = {m.done["digest"] for m in out.members.values() if m.done}
    details = [{"kind": k.kind, "host": e["host"], "leader_host": e["host"] == e["leader_host"],
                "members": k.victims, "recovery_s": k.recovery_s}
               for k, e in zip(out.kills, extra["events"], strict=True)]  # fmt: skip
    joins = []
    for m in out.members.values():
        ok = [x for x in m.steps if x["ok"]]
        if m.rounds and m.rounds[0]["round"] > 0 and ok:
            first = m.rounds[0]
            joins.append({"member": m.id, "seconds": round(ok[0]["t"] - m.started, 3),
                          "until_round_began": round(first["started"] - m.started, 3),
                          "round_seconds": round(first["seconds"], 3),
                          "rounds_tried": first["round"]})  # fmt: skip
    return {
        "ok": not out.problems and not quorum["problems"],
        "problems": out.problems[:10] + quorum["problems"][:5],
        "per_host": per_host,
        "failures_detail": details,
        "replacements_detail": sorted(joins, key=lambda j: -j["seconds"])[:12],
        "host_kills": sum(1 for k in out.kills if k.kind == "kill"),
        "host_cuts": sum(1 for k in out.kills if k.kind == "cut"),
        "hosts_hit": sorted({e["host"] for e in extra["events"]}),
        "leader_hosts_hit": sum(1 for e in extra["events"] if e["host"] == e["leader_host"]),
        "recovery_seconds": {kind: _quantiles(xs) for kind, xs in by_kind.items()},
        "recovery_seconds_leader_host": {kind: _quantiles(xs) for kind, xs in leader.items()},
        "replacement_seconds": _quantiles(out.replacement_seconds()),
        "committed_steps_lost": {"max": max(lost, default=0), "total": sum(lost)},
        "final_digests": len(digests),
        "member_loss_pauses": extra["member_pauses"],
        "step_seconds": extra["step_s"],
        "quorum_loss": quorum,
        "load_before": [round(x, 2) for x in load],
        "load_mid": [round(x, 2) for x in load_mid],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--transports", default="tcp,auto")
    ap.add_argument("--fuzz-seconds", type=float, default=120, help="per fuzz target (6)")
    ap.add_argument("--soak-small", type=int, default=100000)
    ap.add_argument("--soak-large", type=int, default=1000)
    ap.add_argument("--sigints", type=int, default=6)
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--launcher-runs", type=int, default=20)
    ap.add_argument("--elastic-kills", type=int, default=20)
    ap.add_argument("--attack-rounds", type=int, default=3)
    ap.add_argument("--attack-flood", type=int, default=2000)
    ap.add_argument("--host-kills", type=int, default=20)
    ap.add_argument("--host-cuts", type=int, default=10)
    ap.add_argument("--member-losses", type=int, default=3)
    ap.add_argument("--per-host", default="2,1,2,1", help="members on each of the hosts")
    ap.add_argument(
        "--only",
        default="kill,mismatch,fuzz,soak,sigint,overhead,launcher,elastic,attacks,hosts",
    )
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "faults.json"))
    args = ap.parse_args()
    only = set(args.only.split(","))
    summary: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}
    ok = True
    t0 = time.monotonic()
    if "kill" in only:
        log(f"kill -9: {args.kills} runs")
        k = summary["kill"] = kills(args.kills, args.transports.split(","), args.seed)
        ok &= k["failed_runs"] == 0
    if "mismatch" in only:
        log("mismatched calls")
        m = summary["mismatch"] = mismatches([2, 3, 4])
        ok &= m["kinds_ok"] == m["kinds"] and m["kinds"] >= 20
    if "fuzz" in only:
        log("fuzzing")
        f = summary["fuzz"] = fuzz(args.fuzz_seconds)
        ok &= f["ok"]
    if "soak" in only:
        log("soak")
        s = summary["soak"] = soak(args.soak_small, args.soak_large)
        ok &= s["ok"]
    if "sigint" in only:
        log("SIGINT to the launcher")
        g = summary["sigint"] = sigints(args.sigints, args.seed)
        ok &= g["failed_runs"] == 0
    if "overhead" in only:
        log("flight recorder cost")
        summary["overhead"] = overhead()
    if "launcher" in only:
        log(f"launcher notice window: {args.launcher_runs} runs")
        lr = summary["launcher"] = launcher_runs(args.launcher_runs, args.seed)
        ok &= lr["failed_runs"] == 0
    if "elastic" in only:
        log(f"elastic: {args.elastic_kills} kills in a row")
        e = summary["elastic"] = elastic_kills(args.elastic_kills, args.seed)
        ok &= e["ok"]
    if "attacks" in only:
        log(f"attack suite: {args.attack_rounds} rounds, floods of {args.attack_flood}")
        a = summary["attacks"] = attacks(args.attack_rounds, args.attack_flood)
        ok &= a["ok"]
    if "hosts" in only:
        per_host = [int(x) for x in args.per_host.split(",")]
        log(f"hosts: {args.member_losses} etcd members alone, {args.host_kills} hosts killed, "
            f"{args.host_cuts} cut off, the quorum; members per host {per_host}")  # fmt: skip
        h = summary["hosts"] = host_runs(args.host_kills, args.host_cuts, args.member_losses,
                                         per_host, args.seed)  # fmt: skip
        ok &= h["ok"]
    summary["seconds"] = round(time.monotonic() - t0, 1)
    summary["ok"] = bool(ok)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1))
    log("")
    if "kill" in summary:
        k = summary["kill"]
        log(
            f"kill -9: {k['runs']} runs ({', '.join(k['transports'])}; p=3,4), {k['kills']} "
            f"kills, {k['survivors']} survivors, all raised within {k['max_raise_seconds']} s;"
            f" failed runs: {k['failed_runs']}"
        )
    if "mismatch" in summary:
        m = summary["mismatch"]
        log(
            f"mismatch: {m['kinds_ok']}/{m['kinds']} kinds raise MismatchError naming both "
            f"sides at p={m['world_sizes']}"
        )
    if "fuzz" in summary:
        f = summary["fuzz"]
        log(
            f"fuzz: {f['inputs']} inputs over {len(f['targets'])} targets ("
            + ", ".join(f"{t} {v['per_second']}/s" for t, v in f["targets"].items())
            + f"); job beside: {f['side_job']}; RSS growth beside it "
            f"{f['rss_growth_bytes']} bytes; ok={f['ok']}"
        )
    if "soak" in summary:
        log(f"soak: ok={summary['soak']['ok']} {summary['soak']['problems']}")
    if "sigint" in summary:
        g = summary["sigint"]
        log(
            f"sigint: {g['runs']} runs, failed {g['failed_runs']}, slowest "
            f"{g['max_exit_seconds']:.2f} s"
        )
    if "launcher" in summary:
        lr = summary["launcher"]
        log(f"launcher: {lr['runs']} kill runs, every survivor spoke: failed {lr['failed_runs']}")
    if "attacks" in summary:
        a = summary["attacks"]
        log(
            f"attacks: {a['rounds']} rounds of tests/security, floods of {a['flood']}: ok={a['ok']}"
        )
    if "elastic" in summary:
        e = summary["elastic"]
        log(
            f"elastic: {e['kills']} kills ({', '.join(e['kinds'])}, and "
            f"{e['replacements_killed_while_joining']} replacements while joining), "
            f"ok={e['ok']}; survivors "
            f"training again after {e['recovery_seconds']} s; replacements in step after "
            f"{e['replacement_seconds']} s; committed steps lost: "
            f"{e['committed_steps_lost']['total']}; the step in flight committed "
            f"{e['step_in_flight']['committed']}, redone {e['step_in_flight']['redone']} times;"
            f" load {e['load_before']} -> {e['load_after']}"
        )
    if "hosts" in summary:
        h = summary["hosts"]
        if "host_kills" not in h:
            log(f"hosts: {h['problems']}")
        else:
            log(
                f"hosts (etcd): {h['host_kills']} hosts killed, {h['host_cuts']} cut off "
                f"(hosts {h['hosts_hit']}, the etcd leader's {h['leader_hosts_hit']} times), "
                f"ok={h['ok']}; survivors training again after {h['recovery_seconds']} s "
                f"(leader's host: {h['recovery_seconds_leader_host']}); replacements in step "
                f"after {h['replacement_seconds']} s; committed steps lost "
                f"{h['committed_steps_lost']}; {h['final_digests']} final digest(s); etcd "
                f"member lost alone: longest pause {h['member_loss_pauses']} s (step "
                f"{h['step_seconds']} s); quorum lost: {h['quorum_loss']}; load "
                f"{h['load_before']} -> {h['load_mid']} -> {h['load_after']}"
            )
    log(f"{'ALL PASSED' if ok else 'SOME CHECKS FAILED'} in {summary['seconds']} s -> {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
