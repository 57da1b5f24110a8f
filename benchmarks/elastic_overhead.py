"""What pycollective.elastic costs when nothing fails: one step of the Fashion-MNIST small
CNN (93,322 parameters) three ways, in the same ranks, step by step in turn:

- ddp:     torch DDP on the pycollective backend (what a DDP script runs today)
- plain:   the gradients averaged by one flat all_reduce on the default group, as the
           manager does it but without the manager (the same copies in and out)
- elastic: elastic.ddp.DataParallel + Optimizer through an elastic.Manager (the joiner
           flag on the all_reduce, the leader's look at the store, the commit check)
- elastic_etcd: the same through a Manager whose store is an etcd cluster (3 members on
           loopback, started here: tests/_etcd.py): its lease renewals, the watch of
           each round, against the TCP store's manager above

    python benchmarks/elastic_overhead.py [-n 4] [--batch 64] [--steps 300] [--etcd-members 3]

The step is forward, backward, averaging and Adam on --batch / n samples per rank of
synthetic 28x28 images (compute, not data loading, is what is compared). The three run
step by step in turn, so the rest of the machine's load falls on all alike; the manager's
overhead is elastic against plain, in the median step time (the slowest rank's) and in CPU
time per rank; the manager's own work is also timed directly. The load average is printed
beside it. Writes benchmarks/results/elastic_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODES = ("ddp", "plain", "elastic", "elastic_etcd")


def worker(args: argparse.Namespace) -> None:
    import numpy as np
    import torch.distributed as tdist

    import pycollective as dist
    import torch
    from pycollective import elastic
    from pycollective.elastic import ddp
    from torch import nn

    sys.path.insert(0, str(REPO / "examples" / "fashion_mnist"))
    import models

    torch.set_num_threads(1)
    dist.init_process_group()
    tdist.init_process_group("pycollective")
    rank, size = dist.get_rank(), dist.get_world_size()
    local = args.batch // size
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(local, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (local,), generator=gen)

    def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = models.small()
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    ddp_model, ddp_opt = fresh()
    ddp_net = nn.parallel.DistributedDataParallel(ddp_model)
    plain_model, plain_opt = fresh()
    plain_params = list(plain_model.parameters())
    total = sum(p.numel() for p in plain_params)
    flat = np.empty(total + 1, np.float32)
    el_model, el_inner = fresh()
    manager = elastic.Manager(
        lambda: {"m": el_model.state_dict(), "o": el_inner.state_dict()},
        lambda s: (el_model.load_state_dict(s["m"]), el_inner.load_state_dict(s["o"])),
    )
    el_net = ddp.DataParallel(manager, el_model)
    el_opt = ddp.Optimizer(manager, el_inner)
    modes = MODES if args.etcd else MODES[:3]
    if args.etcd:
        from pycollective.store import EtcdStore

        et_model, et_inner = fresh()
        et_store = EtcdStore(args.etcd, "elastic-overhead", timeout=60)
        et_manager = elastic.Manager(
            lambda: {"m": et_model.state_dict(), "o": et_inner.state_dict()},
            lambda s: (et_model.load_state_dict(s["m"]), et_inner.load_state_dict(s["o"])),
            store=et_store, job="bench",
        )  # fmt: skip
        et_net = ddp.DataParallel(et_manager, et_model)
        et_opt = ddp.Optimizer(et_manager, et_inner)

    def step_ddp() -> None:
        ddp_opt.zero_grad()
        nn.functional.cross_entropy(ddp_net(x), y).backward()
        ddp_opt.step()

    def step_plain() -> None:
        plain_opt.zero_grad()
        nn.functional.cross_entropy(plain_model(x), y).backward()
        at = 0
        for p in plain_params:
            flat[at : at + p.numel()] = p.grad.numpy().reshape(-1)
            at += p.numel()
        flat[:total] *= 1.0 / size
        dist.all_reduce(flat)
        at = 0
        for p in plain_params:
            p.grad.numpy().reshape(-1)[:] = flat[at : at + p.numel()]
            at += p.numel()
        plain_opt.step()

    def step_elastic() -> None:
        manager.start_step()
        el_opt.zero_grad()
        nn.functional.cross_entropy(el_net(x), y).backward()
        el_opt.step()

    def step_elastic_etcd() -> None:
        et_manager.start_step()
        et_opt.zero_grad()
        nn.functional.cross_entropy(et_net(x), y).backward()
        et_opt.step()

    steps = {"ddp": step_ddp, "plain": step_plain, "elastic": step_elastic,
             "elastic_etcd": step_elastic_etcd}  # fmt: skip
    for mode in modes:  # warm up (the elastic groups form in their first step)
        for _ in range(5):
            steps[mode]()
    # Step by step, the modes in turn (the order rotating), so that a burst of load from
    # the rest of the machine falls on all three alike; wall time (the slowest rank's) and
    # this process's CPU time per step.
    wall = {m: np.zeros(args.steps) for m in modes}
    cpu = {m: np.zeros(args.steps) for m in modes}
    for i in range(args.steps):
        k = i % len(modes)
        for mode in modes[k:] + modes[:k]:
            t0, c0 = time.perf_counter(), time.process_time()
            steps[mode]()
            wall[mode][i] = time.perf_counter() - t0
            cpu[mode][i] = time.process_time() - c0
    medians: dict[str, list[float]] = {}
    for m in modes:
        dist.all_reduce(wall[m], op=dist.ReduceOp.MAX)  # a step is its slowest rank's
        dist.all_reduce(cpu[m], op=dist.ReduceOp.SUM)
        medians[m] = [float(np.median(wall[m]))]
        medians[f"cpu_{m}"] = [float(np.median(cpu[m])) / size]
    # The manager's own work, timed directly: the leader's look at the store for newcomers
    # (the only I/O it adds, made by a thread every 50 ms, off the step's path) and the
    # step's bookkeeping.
    n = 200
    t0 = time.perf_counter()
    key = manager._key("round", manager.round + 1, "n")
    for _ in range(n):
        manager._store.check([key])  # what the leader's watcher thread does every 50 ms
    store_check = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        manager._carried, manager._pending = True, False
        manager.start_step()
        manager.should_commit()
    bookkeeping = (time.perf_counter() - t0) / n
    renewal = 0.0
    if args.etcd:
        # what the etcd manager adds off the step's path: its lease renewals (two requests,
        # the member's lease and the job's, every third of the 2 s TTL), timed directly
        c0 = time.process_time()
        for _ in range(n // 4):
            et_store._keepalive_once(et_store._session_lease, et_store.session_ttl)
            et_store._keepalive_once(et_store._job_lease, et_store.session_ttl)
        renewal = (time.process_time() - c0) / (n // 4)
    manager.close()
    if args.etcd:
        et_manager.close()
        et_store.close()
    tdist.destroy_process_group()
    dist.destroy_process_group()
    if rank == 0:
        medians["store_check_s"] = [store_check]
        medians["bookkeeping_s"] = [bookkeeping]
        medians["etcd_renewal_cpu_s"] = [renewal]
        print("RESULT " + json.dumps(medians), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64, help="global batch per step")
    ap.add_argument("--steps", type=int, default=300, help="steps per mode")
    ap.add_argument(
        "--etcd-members",
        type=int,
        default=3,
        help="etcd members on loopback for the elastic_etcd mode (0: leave it out)",
    )
    ap.add_argument("--etcd", default="", help=argparse.SUPPRESS)  # the worker's endpoints
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--json", default=str(REPO / "benchmarks" / "results" / "elastic_overhead.json")
    )
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    cluster = None
    if args.etcd_members:
        sys.path.insert(0, str(REPO))
        from tests._etcd import EtcdCluster

        cluster = EtcdCluster(args.etcd_members).start()
    load0 = os.getloadavg()
    cmd = [sys.executable, "-m", "pycollective", "run", "-n", str(args.n), sys.executable,
           __file__, "--worker", "--batch", str(args.batch),
           "--steps", str(args.steps)]  # fmt: skip
    if cluster is not None:
        cmd += ["--etcd", cluster.endpoints]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    finally:
        if cluster is not None:
            cluster.close()
    load1 = os.getloadavg()
    line = next((ln for ln in res.stdout.splitlines() if "RESULT " in ln), None)
    if res.returncode != 0 or line is None:
        print(res.stderr[-3000:], file=sys.stderr)
        return 1
    medians = json.loads(line.split("RESULT ", 1)[1])
    direct = {k: medians.pop(k)[0] for k in ("store_check_s", "bookkeeping_s")}
    renewal_cpu = medians.pop("etcd_renewal_cpu_s")[0]
    modes = [m for m in MODES if m in medians]
    ms = {m: 1000 * medians[m][0] for m in modes}
    cpu_ms = {m: 1000 * medians[f"cpu_{m}"][0] for m in modes}
    over = ms["elastic"] / ms["plain"] - 1
    over_cpu = cpu_ms["elastic"] / cpu_ms["plain"] - 1
    report = {
        "ranks": args.n, "global_batch": args.batch, "steps_per_mode": args.steps,
        "step_ms": ms, "cpu_ms_per_rank": cpu_ms,
        "elastic_vs_plain": over, "elastic_vs_plain_cpu": over_cpu,
        "elastic_vs_ddp": ms["elastic"] / ms["ddp"] - 1,
        "manager_work_ms": {k[:-2]: 1000 * v for k, v in direct.items()},
        # the step's own part (the look at the store is a thread's, every 50 ms)
        "manager_work_vs_plain_step": 1000 * direct["bookkeeping_s"] / ms["plain"],
        "watcher_cpu_share": direct["store_check_s"] / 0.05,
        "load_before": load0, "load_after": load1,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }  # fmt: skip
    if "elastic_etcd" in ms:
        report["etcd_renewal_cpu_ms"] = 1000 * renewal_cpu
        report["etcd_renewal_core_share"] = renewal_cpu / (2.0 / 3)  # every 0.67 s
        report["etcd_vs_tcp_store"] = ms["elastic_etcd"] / ms["elastic"] - 1
        report["etcd_vs_tcp_store_cpu"] = cpu_ms["elastic_etcd"] / cpu_ms["elastic"] - 1
    print(f"small CNN, {args.n} ranks, global batch {args.batch} (load {load0[0]:.1f} -> "
          f"{load1[0]:.1f})")  # fmt: skip
    for m in modes:
        print(f"  {m:12s} {ms[m]:7.2f} ms per step (median), {cpu_ms[m]:6.2f} ms CPU per rank")
    if "etcd_vs_tcp_store" in report:
        print(f"  elastic on etcd vs on the TCP store: {100 * report['etcd_vs_tcp_store']:+.1f}% "
              f"wall, {100 * report['etcd_vs_tcp_store_cpu']:+.1f}% CPU; its lease renewals "
              f"{report['etcd_renewal_cpu_ms']:.2f} ms CPU every 0.67 s "
              f"({100 * report['etcd_renewal_core_share']:.2f}% of a core, off the step's "
              "path)")  # fmt: skip
    print(f"  elastic vs plain: {100 * over:+.1f}% wall, {100 * over_cpu:+.1f}% CPU; "
          f"vs ddp: {100 * report['elastic_vs_ddp']:+.1f}% wall")  # fmt: skip
    work = report["manager_work_ms"]
    print(f"  the manager's own work, timed directly: bookkeeping {work['bookkeeping']:.3f} ms "
          f"per step ({100 * report['manager_work_vs_plain_step']:.2f}% of a plain step); the "
          f"leader's watcher thread: {work['store_check']:.3f} ms per look every 50 ms "
          f"({100 * report['watcher_cpu_share']:.2f}% of a core, off the step's path)")  # fmt: skip
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
