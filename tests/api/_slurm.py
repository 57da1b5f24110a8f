"""A real Slurm for the tests: munged, slurmctld and slurmd (Debian's slurm-wlm and munge),
configured in a temporary directory for this host, or for hosts made of network namespaces
(tools/nethosts.py), started and stopped by the test. Nothing outside that directory is
read or written: the munge key, sockets, state, spool and logs all live in it, and every
daemon is a child of the test, stopped by its pid."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pycollective._netutil import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "scontrol")


def unavailable() -> str | None:
    """Why a Slurm cannot be started here (None if it can)."""
    if os.geteuid() != 0:
        return "starting slurmctld, slurmd and munged needs root"
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return (
            f"{', '.join(missing)} not installed (Debian: apt-get install slurm-wlm munge; "
            "make system-deps does it as root)"
        )
    return None


class Slurm:
    """One cluster: `nodes` are (name, address); `wrap(k, argv)` runs argv on node k (the
    identity for this host, `ip netns exec ...` for a namespace host). slurmctld and srun
    run on node 0."""

    def __init__(
        self,
        root: Path,
        nodes: Sequence[tuple[str, str]],
        wrap: Callable[[int, list[str]], list[str]] | None = None,
        cpus: int = 8,
    ) -> None:
        self.root = root
        self.nodes = list(nodes)
        self.wrap = wrap or (lambda _k, argv: argv)
        self.cpus = cpus
        self.procs: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def _config(self) -> str:
        r = self.root
        ctld_name, ctld_addr = self.nodes[0]
        lines = [
            "ClusterName=pyctest",
            # Job ids of their own: ranks derive their rendezvous port and store keys from
            # the job id, and two clusters (two suites at once) must not both start at 1.
            f"FirstJobId={random.randrange(1000, 60_000_000)}",
            f"SlurmctldHost={ctld_name}({ctld_addr})",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={r / 'munge.sock'}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool-%n'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",  # no cgroups needed
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            # More CPUs than the machine has, so that 4 tasks fit on 2 cores.
            "SlurmdParameters=config_overrides",
        ]
        lines += [
            f"NodeName={name} NodeAddr={addr} CPUs={self.cpus} State=UNKNOWN"
            for name, addr in self.nodes
        ]
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _start(self, k: int, argv: list[str], log: str) -> subprocess.Popen:
        out = open(self.root / log, "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            self.wrap(k, argv), env=self.env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        out.close()
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 30.0) -> None:
        r = self.root
        (r / "state").mkdir()
        key = r / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(self._config())
        # munged's socket is a file: one daemon serves every node (namespaces share /tmp).
        self._start(0, ["munged", "--foreground", "--force", f"--socket={r / 'munge.sock'}",
                        f"--key-file={key}", f"--log-file={r / 'munged.log'}",
                        f"--pid-file={r / 'munged.pid'}", f"--seed-file={r / 'munged.seed'}"],
                    "munged.out")  # fmt: skip
        self._wait(lambda: (r / "munge.sock").exists(), timeout, "munged")
        self._start(0, ["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
        for k, (name, _addr) in enumerate(self.nodes):
            (r / f"spool-{name}").mkdir()
            self._start(k, ["slurmd", "-D", "-N", name, "-f", str(self.conf)], f"slurmd-{k}.out")
        self._wait(self._all_idle, timeout, "the nodes to be idle")

    def _all_idle(self) -> bool:
        res = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10)
        states = dict(line.split() for line in res.stdout.splitlines() if line.strip())
        return len(states) == len(self.nodes) and all(
            s in ("idle", "mix", "alloc") for s in states.values()
        )

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead[0].args[0]} exited while waiting for {what}:\n"
                                   + self.logs())  # fmt: skip
            with contextlib.suppress(subprocess.SubprocessError, ValueError):
                if ready():
                    return
            time.sleep(0.2)
        raise RuntimeError(f"Slurm did not start within {timeout:g} s (waiting for {what}):\n"
                           + self.logs())  # fmt: skip

    def logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.out")) + sorted(self.root.glob("*.log")):
            text = path.read_text(errors="replace")[-1500:]
            parts.append(f"--- {path.name}\n{text}")
        return "\n".join(parts)

    def run(self, argv: list[str], timeout: float = 120, env: dict | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:  # fmt: skip
        """A Slurm command (srun, sbatch, sinfo) on node 0."""
        full = dict(self.env if env is None else {**env, "SLURM_CONF": str(self.conf)})
        return subprocess.run(
            self.wrap(0, [str(a) for a in argv]), env=full, cwd=cwd, capture_output=True,
            text=True, timeout=timeout,
        )  # fmt: skip

    def stop(self) -> None:
        for proc in reversed(self.procs):  # slurmd, slurmctld, then munged
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()
