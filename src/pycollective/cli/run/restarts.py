"""Starting every rank of the job with its environment, and again after a failure
(`--max-restarts`, as torchrun), until the job succeeds or no restart is left."""

from __future__ import annotations

import signal
import subprocess
import threading

from .ranks import Output, Rank, parent_death_signal, pump, reap
from .supervisor import Job


def run_job(
    nprocs: int,
    command: list[str],
    nnodes: int,
    node_rank: int,
    master_addr: str,
    master_port: int,
    prefix: bool,
    grace: float,
    base_env: dict[str, str],
    job_vars: dict[str, str],
    out: Output,
    err: Output,
    servers: int = 0,
    notice: float = 2.0,
    max_restarts: int = 0,
    elastic: tuple[int, int] | None = None,
    etcd: bool = False,
) -> int:
    received: list[int] = []
    in_main = threading.current_thread() is threading.main_thread()
    previous: dict[int, object] = {}
    if in_main:  # signal handlers can only be installed from the main thread
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, _frame: received.append(signum))

    preexec = parent_death_signal()
    world_size = nprocs * nnodes + servers
    started: list[Rank] = []
    restart = 0

    def spawn(rank: int, local_rank: int) -> Rank:
        child_env = dict(base_env)
        child_env.update(job_vars)
        if servers:
            child_env.update(
                PYCOLLECTIVE_NUM_SERVERS=str(servers),
                PYCOLLECTIVE_ROLE="server" if local_rank >= nprocs else "worker",
            )
        if elastic is not None:
            child_env["PYCOLLECTIVE_ELASTIC"] = f"{elastic[0]}:{elastic[1]}"
        if not etcd:
            child_env["PYCOLLECTIVE_STORE_HOSTED"] = "1"  # node 0's launcher serves it
        child_env.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(nprocs + servers),
            GROUP_RANK=str(node_rank),
            GROUP_WORLD_SIZE=str(nnodes),
            NODE_RANK=str(node_rank),
            ROLE_RANK=str(rank),
            ROLE_WORLD_SIZE=str(world_size),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            # torchelastic's names: the attempt, which also names this round's store keys
            TORCHELASTIC_RESTART_COUNT=str(restart),
            TORCHELASTIC_MAX_RESTARTS=str(max_restarts),
            PYCOLLECTIVE_RESTART_COUNT=str(restart),
            PYTHONUNBUFFERED="1",
        )
        proc = subprocess.Popen(
            command,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # own process group: a killpg takes grandchildren
            preexec_fn=preexec,
        )
        r = Rank(rank, proc, local_rank)
        started.append(r)
        tag = f"[rank {rank}]: ".encode() if prefix else b""
        assert proc.stdout is not None and proc.stderr is not None
        for pipe, dest, tail in ((proc.stdout, out, None), (proc.stderr, err, r.stderr_tail)):
            t = threading.Thread(target=pump, args=(pipe, dest, tag, tail), daemon=True)
            t.start()
            r.readers.append(t)
        return r

    try:
        while True:
            ranks: list[Rank] = []
            try:
                for local_rank in range(nprocs + servers):
                    ranks.append(spawn(node_rank * nprocs + local_rank, local_rank))
            except OSError as exc:
                err.write(b"", f"pycollective run: cannot start {command[0]!r}: {exc}".encode())
                return 127 if isinstance(exc, FileNotFoundError) else 126
            job = Job(
                spawn, ranks, notice, grace, received, err,
                # across nodes (etcd) this launcher sees only its own ranks: the manager
                # judges MIN over the whole job, so any rank killed by a signal is a loss
                elastic_min=(0 if etcd else elastic[0]) if elastic else None,
                replacements=max_restarts if elastic else 0,
                next_id=world_size,
            )  # fmt: skip
            status = job.supervise()
            reap(started)
            if status == 0 or job.launcher_signal is not None or elastic is not None:
                return status
            if restart >= max_restarts:
                if max_restarts:
                    job.say(f"no restarts left (--max-restarts {max_restarts})")
                return status
            restart += 1
            job.say(f"restarting every rank (restart {restart} of {max_restarts})")
    finally:
        reap(started)
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)  # type: ignore[arg-type]
