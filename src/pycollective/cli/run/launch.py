"""`launch`: one node's part of a job: the job's key, store and flight-recorder folder, the
ranks (restarts.py), and what the dumps and the timeline say afterwards."""

from __future__ import annotations

import math
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import BinaryIO

from ... import _auth, _config
from ..._errors import UsageError
from ...observe import diagnose
from ...observe import timeline as _timeline
from ...store import TCPStoreServer
from ...store._etcd_endpoints import parse_endpoints
from .options import command_line, rank_environment
from .ranks import Output
from .restarts import run_job


def launch(
    nprocs: int,
    cmd: Sequence[str],
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int = 0,
    prefix: bool = True,
    grace: float = 5.0,
    env: Mapping[str, str] | None = None,
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
    servers: int = 0,
    module: bool = False,
    no_python: bool = False,
    notice: float = 2.0,
    max_restarts: int = 0,
    elastic: tuple[int, int] | None = None,
    tls: bool = False,
    etcd: tuple[str, str] | None = None,
    etcd_env: Mapping[str, str] | None = None,
) -> int:
    """Run `cmd` as `nprocs` ranks on this node (node `node_rank` of `nnodes`).

    With `etcd` (endpoints, job name) the ranks meet in that etcd cluster
    (PYCOLLECTIVE_STORE=etcd://endpoints/job, and `etcd_env`: its TLS/auth settings);
    no launcher hosts a store, so none is special, and `elastic` may span nodes (each
    launcher then starts replacements for its own ranks; the elastic manager enforces
    MIN and MAX over the whole job).

    When a rank fails, the others get `notice` seconds to exit on their own, then SIGUSR1
    (flight recorders dump), SIGTERM and `grace` seconds before SIGKILL. With
    `max_restarts` K, a failed job is started again, every rank of it, up to K times
    (TORCHELASTIC_RESTART_COUNT and PYCOLLECTIVE_RESTART_COUNT say which attempt this is;
    each attempt meets in a store round of its own). With `elastic` (MIN, MAX), a failure
    that leaves at least MIN ranks running stops nobody: the ranks (pycollective.elastic)
    go on without it, and up to `max_restarts` replacements are started.

    With `servers` > 0 (single node), `servers` more ranks run the same command after the
    workers, as parameter servers: every rank gets PYCOLLECTIVE_NUM_SERVERS and
    PYCOLLECTIVE_ROLE (worker or server); see pycollective.ps.

    Returns 0 if every rank exited 0; otherwise the first failing rank's exit status
    (128 + N if it died of signal N), or 128 + N if the launcher itself got signal N.
    Every connection of the job proves the job's key: on one node a key made for this job
    (unless PYCOLLECTIVE_SECRET or PYCOLLECTIVE_SECRET_FILE names one), on several nodes
    the user's (the per-user key file of a shared home, or one of those variables on every
    node). With `tls`, the job's connections also run TLS 1.3 (PYCOLLECTIVE_TLS=1).
    `env` replaces os.environ as the base of the ranks' environment; `stdout`/`stderr`
    are binary streams (default: the launcher's own). SIGINT/SIGTERM are forwarded only
    when called from the main thread (where Python lets us catch them).
    """
    if nprocs < 1:
        raise UsageError(f"nprocs must be >= 1, got {nprocs}")
    if servers < 0 or (servers and nnodes > 1):
        raise UsageError(f"--servers must be >= 0 and needs a single node, got {servers}")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise UsageError(f"node rank {node_rank} is not in 0..{nnodes - 1}")
    if not 0 <= grace < math.inf:  # NaN fails this too
        raise UsageError(f"grace must be a finite number of seconds >= 0, got {grace}")
    if not 0 <= notice < math.inf:
        raise UsageError(f"notice must be a finite number of seconds >= 0, got {notice}")
    if max_restarts < 0:
        raise UsageError(f"--max-restarts must be >= 0, got {max_restarts}")
    if elastic is not None:
        lo, hi = elastic
        if etcd is not None:
            if not 1 <= lo <= hi or nprocs > hi or servers:
                raise UsageError(
                    f"--elastic {lo}:{hi} needs 1 <= MIN <= MAX and at most MAX ranks here "
                    f"(-n {nprocs}), without --servers"
                )
        elif not 1 <= lo <= hi or not lo <= nprocs <= hi or nnodes > 1 or servers:
            raise UsageError(
                f"--elastic {lo}:{hi} needs 1 <= MIN <= N <= MAX (N = {nprocs} ranks) on a "
                "single node without --servers (across nodes: --rdzv-backend etcd)"
            )
    if not 0 <= master_port < 65536:
        raise UsageError(f"master port must be in 0..65535, got {master_port}")
    if nnodes > 1 and etcd is None and (master_addr is None or master_port == 0):
        raise UsageError("a multi-node job needs --master-addr and a non-zero --master-port")
    command = command_line(cmd, module=module, no_python=no_python)
    base_env = dict(os.environ if env is None else env)
    out = Output(stdout if stdout is not None else sys.stdout.buffer)
    err = Output(stderr if stderr is not None else sys.stderr.buffer)
    # A single-node job listens on loopback only, unless told an address to be reached at.
    bind = "" if nnodes > 1 else (master_addr or "127.0.0.1")
    master_addr = master_addr or "127.0.0.1"

    # What the ranks' environment gets besides torchrun's contract.
    job_vars: dict[str, str] = {}
    if tls:
        job_vars["PYCOLLECTIVE_TLS"] = "1"
    if (
        nnodes == 1
        and not _config.is_set("PYCOLLECTIVE_SECRET", base_env)
        and not _config.is_set("PYCOLLECTIVE_SECRET_FILE", base_env)
        and _config.get("PYCOLLECTIVE_INSECURE", base_env) != "1"
    ):
        # One node: a key of this job's own, which no other job of this user shares. Nodes
        # cannot agree on an invented one: there the ranks (and this launcher) read the
        # user's (the per-user key file of a shared home, or what the user set).
        job_vars["PYCOLLECTIVE_SECRET"] = secrets.token_hex(32)
    creds = _auth.credentials(None, {**base_env, **job_vars})

    server: TCPStoreServer | None = None
    if etcd is not None:
        # The ranks meet in etcd; MASTER_ADDR only tells them which interface to listen
        # on (the one towards the first endpoint).
        endpoints, job = etcd
        parsed = parse_endpoints(endpoints)
        master_addr, master_port = parsed[0].host, parsed[0].port
        etcd_tls = any(e.scheme == "https" for e in parsed) or bool(
            (etcd_env or {}).get("PYCOLLECTIVE_ETCD_CACERT"))  # fmt: skip
        hosts = ",".join(str(e) for e in parsed)
        job_vars["PYCOLLECTIVE_STORE"] = f"{'etcds' if etcd_tls else 'etcd'}://{hosts}/{job}"
        job_vars.update(etcd_env or {})
    elif node_rank == 0:
        server = TCPStoreServer(bind, master_port, creds).start()
        master_port = server.port
    # Flight-recorder dumps of this job go to a directory of its own (unless the user
    # chose one), so that a failure can be diagnosed from exactly this job's files.
    flight_dir = None
    if not base_env.get("PYCOLLECTIVE_FLIGHT_DIR"):
        flight_dir = tempfile.mkdtemp(prefix="pycollective-flight-")
        job_vars["PYCOLLECTIVE_FLIGHT_DIR"] = flight_dir
    omp, note = rank_environment(base_env, nprocs + servers)
    job_vars.update(omp)
    if note:
        err.write(b"", note.encode())
    job_vars.setdefault("PYCOLLECTIVE_JOB_ID", f"{os.getpid()}-{secrets.token_hex(4)}")
    try:
        status = run_job(
            nprocs, command, nnodes, node_rank, master_addr, master_port,
            prefix, grace, base_env, job_vars, out, err, servers,
            notice, max_restarts, elastic, etcd is not None,
        )  # fmt: skip
    finally:
        if server is not None:
            server.close()
    _report_flight(
        flight_dir or base_env["PYCOLLECTIVE_FLIGHT_DIR"],
        status,
        err,
        remove_if_empty=flight_dir is not None,
    )
    if base_env.get("PYCOLLECTIVE_TIMELINE", "").strip() and nnodes == 1:
        _merge_timeline(
            base_env["PYCOLLECTIVE_TIMELINE"].strip(), job_vars["PYCOLLECTIVE_JOB_ID"], err
        )
    return status


def _merge_timeline(template: str, job: str, err: Output) -> None:
    """PYCOLLECTIVE_TIMELINE=FILE: merge this job's per-rank files into FILE."""
    try:
        out = _timeline.write_merged(template, job=job)
    except (OSError, ValueError, KeyError) as exc:  # a damaged file must not fail the job
        err.write(b"", f"pycollective run: could not merge the timeline: {exc}".encode())
        return
    if out is not None:
        err.write(b"", f"pycollective run: timeline in {out} (Chrome trace format)".encode())


def _report_flight(directory: str, status: int, err: Output, remove_if_empty: bool) -> None:
    """After a failed job, say what the flight-recorder dumps show; leave no empty dir."""
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".json")]
    except OSError:
        return
    if not names:
        if remove_if_empty:
            shutil.rmtree(directory, ignore_errors=True)
        return
    if status == 0:  # e.g. an elastic job that went on after failures
        err.write(b"", f"pycollective run: flight recorder dumps of the failures the job "
                       f"went on from in {directory}".encode())  # fmt: skip
        return
    lines = [
        f"pycollective run: flight recorder dumps in {directory} "
        f"(pycollective diagnose {directory}):"
    ]
    try:
        for findings in diagnose.analyze(diagnose.load([directory])).values():
            lines.extend(f"    {f.text}" for f in findings)
    except (KeyError, TypeError, ValueError) as exc:  # a damaged dump must not hide the rest
        lines.append(f"    (could not analyze the dumps: {exc})")
    err.write(b"", "\n".join(lines).encode())
