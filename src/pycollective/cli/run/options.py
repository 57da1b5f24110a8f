"""The arguments of `pycollective run`, in its own spellings and in torchrun's and mpirun's,
resolved to `launch`'s keywords; what each rank executes and its extra environment."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Mapping, Sequence

from ..._errors import UsageError
from ...store._etcd_endpoints import parse_endpoints
from .._args import seconds


def _min_max(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        pair = (int(lo), int(hi if sep else lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX (two integers), got {text!r}") from None
    if not 1 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return pair


# torchrun's default port for --rdzv-endpoint HOST without one.
_RDZV_DEFAULT_PORT = 29400
_OMP_NOTE = (
    "pycollective run: setting OMP_NUM_THREADS=1 for each rank (as torchrun does) so that "
    "{n} ranks do not overload the cores; export OMP_NUM_THREADS to choose another value"
)


def _named(name: str, value: str) -> tuple[str, str]:
    return name, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """torchrun's spellings (dashes or underscores), mpirun's -np, and our own options."""
    parser.add_argument(
        "-n", "-np", "--np", "--nproc-per-node", "--nproc_per_node", dest="nprocs",
        default="1", metavar="N",
        help="ranks to start on this node: a number, or 'cpu'/'auto' for one per core "
        "(default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--nnodes", default="1", metavar="K",
        help="nodes in the job (default 1; torchrun's K:K is accepted)",
    )  # fmt: skip
    parser.add_argument(
        "--node-rank", "--node_rank", type=int, default=None, metavar="I",
        help="this node's rank, 0..K-1 (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--master-addr", "--master_addr", default=None, metavar="HOST",
        help="address of node 0, where the store runs (default 127.0.0.1)",
    )  # fmt: skip
    parser.add_argument(
        "--master-port", "--master_port", type=int, default=None, metavar="PORT",
        help="store port on node 0 (default: a free port; required with --nnodes > 1)",
    )  # fmt: skip
    parser.add_argument(
        "--standalone", action="store_true",
        help="a single-node job on a free local port (torchrun's flag; also the default)",
    )  # fmt: skip
    parser.add_argument(
        "--rdzv-endpoint", "--rdzv_endpoint", default=None, metavar="HOST[:PORT]",
        help=f"torchrun's rendezvous endpoint: the same as --master-addr HOST --master-port "
        f"PORT (port {_RDZV_DEFAULT_PORT} if omitted); with --rdzv-backend etcd, the etcd "
        "members HOST:PORT,HOST:PORT,... (tried in turn; port 2379 if omitted)",
    )  # fmt: skip
    parser.add_argument(
        "--rdzv-backend", "--rdzv_backend", default=None, metavar="NAME",
        help="c10d or static (both mean the store node 0's launcher hosts), or etcd: the "
        "ranks meet in the etcd cluster at --rdzv-endpoint, so no host is special",
    )  # fmt: skip
    parser.add_argument(
        "--rdzv-id", "--rdzv_id", default=None, metavar="ID",
        help="with --rdzv-backend etcd, the job's name there (the same on every node; "
        "default 'default'); otherwise accepted for torchrun scripts",
    )  # fmt: skip
    parser.add_argument(
        "--rdzv-conf", "--rdzv_conf", default=None, metavar="K=V,...",
        help="with --rdzv-backend etcd, etcd's own security, passed through: cacert=, "
        "cert=, key= (TLS), user=, password_file= (etcd auth); otherwise ignored",
    )  # fmt: skip
    parser.add_argument(
        "-m", "--module", action="store_true",
        help="run the program as a Python module, as `python -m` does",
    )  # fmt: skip
    parser.add_argument(
        "--no-python", "--no_python", dest="no_python", action="store_true",
        help="run the program directly, without this Python (e.g. a shell script)",
    )  # fmt: skip
    parser.add_argument(
        "--servers", type=int, default=0, metavar="S",
        help="also start S parameter servers after the N workers (see pycollective.ps)",
    )  # fmt: skip
    parser.add_argument(
        "--notice", type=seconds, default=2.0, metavar="SECONDS",
        help="after a rank fails, seconds the others get to exit on their own before any "
        "signal (default 2)",
    )  # fmt: skip
    parser.add_argument(
        "--grace", type=seconds, default=5.0,
        help="seconds between SIGTERM and SIGKILL when the ranks are stopped (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--max-restarts", "--max_restarts", type=int, default=0, metavar="K",
        help="start every rank again after a failure, up to K times (torchrun's meaning); "
        "with --elastic, the number of replacement ranks (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--elastic", type=_min_max, default=None, metavar="MIN:MAX",
        help="in-job recovery (pycollective.elastic): a lost rank does not stop the job "
        "while MIN ranks run; members may be MAX at most",
    )  # fmt: skip
    parser.add_argument(
        "--tls", action="store_true",
        help="encrypt and integrity-check every connection of the job with TLS 1.3 "
        "(PYCOLLECTIVE_TLS=1; certificates from a per-job CA derived from the job's key, or "
        "PYCOLLECTIVE_TLS_CERT/KEY/CA)",
    )  # fmt: skip
    parser.add_argument(
        "--no-prefix", dest="prefix", action="store_false",
        help='do not prefix output lines with "[rank N]: "',
    )  # fmt: skip
    # torchrun's other options: named, so that their message says what to do instead of
    # argparse's "unrecognized arguments" (resolve_options).
    for names in _TORCHRUN_OTHERS:
        parser.add_argument(
            *names, dest="torchrun_others", action="append",
            type=functools.partial(_named, names[0]), default=[], help=argparse.SUPPRESS,
        )  # fmt: skip
    parser.add_argument(
        "command", nargs=argparse.REMAINDER,
        help="program and arguments (a .py file runs with this Python)",
    )  # fmt: skip


def _count(text: str, what: str) -> int:
    if text in ("cpu", "auto"):
        return os.cpu_count() or 1
    if text == "gpu":
        raise UsageError(f"{what} gpu: pycollective runs on CPUs; give a number or 'cpu'")
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{what} must be a number or 'cpu', got {text!r}") from None


def _nnodes(text: str) -> int:
    lo, sep, hi = text.partition(":")
    if sep and lo != hi:
        raise UsageError(
            f"--nnodes {text}: a range of node counts (torchrun's elastic MIN:MAX) is not "
            "supported; give one number (a varying number of ranks on one node: --elastic "
            "MIN:MAX)"
        )
    try:
        return int(lo)
    except ValueError:
        raise UsageError(f"--nnodes must be a number, got {text!r}") from None


# torchrun options with no counterpart here: the ones that only tune torchrun's own agent
# are ignored with a note; the ones a job's outcome depends on are refused, saying instead.
_TORCHRUN_IGNORED = {
    "--monitor-interval": "the launcher watches its ranks every 20 ms",
    "--start-method": "every rank is a process of its own (a fresh interpreter)",
    "--role": "every rank has the role 'default'",
}
_TORCHRUN_REFUSED = {
    "--log-dir": "every line of every rank comes to the launcher's stdout/stderr with a "
    "[rank N] prefix: redirect those (pycollective run ... > job.log 2>&1)",
    "--redirects": "output is always forwarded line by line with a [rank N] prefix "
    "(--no-prefix drops it)",
    "--tee": "output is always forwarded line by line with a [rank N] prefix "
    "(--no-prefix drops it)",
    "--local-ranks-filter": "every rank's output is shown; filter it with grep '^\\[rank 0\\]'",
    "--run-path": "ranks are processes of their own: run the script itself",
    "--local-addr": "set PYCOLLECTIVE_SOCKET_IFNAME to choose the interface ranks listen on",
}
_TORCHRUN_OTHERS = [
    (name, name.replace("-", "_").replace("__", "--"), *(("-r",) if name == "--redirects"
                                                          else ("-t",) if name == "--tee"
                                                          else ()))
    for name in (*_TORCHRUN_IGNORED, *_TORCHRUN_REFUSED)
]  # fmt: skip


def _torchrun_others(given: list[tuple[str, str]]) -> list[str]:
    """Notes for torchrun's options that do not apply here; UsageError for those a job
    depends on."""
    notes = []
    for name, _value in given:
        if name in _TORCHRUN_REFUSED:
            raise UsageError(f"{name} (torchrun's) is not supported: {_TORCHRUN_REFUSED[name]}")
        notes.append(f"pycollective run: {name} (torchrun's) is ignored: {_TORCHRUN_IGNORED[name]}")
    return notes


def resolve_options(args: argparse.Namespace) -> dict:
    """The parsed command line as launch()'s keyword arguments (raises UsageError)."""
    for note in _torchrun_others(getattr(args, "torchrun_others", [])):
        print(note, file=sys.stderr)
    nprocs = _count(str(args.nprocs), "-n/--nproc-per-node")
    nnodes = _nnodes(str(args.nnodes))
    master_addr, master_port = args.master_addr, args.master_port
    backend = (args.rdzv_backend or "").lower()
    if backend in ("etcd", "etcd-v2"):
        return _etcd_options(args, nprocs, nnodes)
    if backend not in ("", "c10d", "static"):
        raise UsageError(
            f"--rdzv-backend {args.rdzv_backend}: c10d, static (both use the store that node "
            "0's launcher hosts) and etcd are supported"
        )
    if args.rdzv_conf:
        print("pycollective run: --rdzv-conf is ignored: the store's timeouts follow "
              "PYCOLLECTIVE_TIMEOUT", file=sys.stderr)  # fmt: skip
    if args.standalone:
        if nnodes != 1:
            raise UsageError(f"--standalone is a single-node job, but --nnodes is {nnodes}")
        if args.rdzv_endpoint or master_addr or master_port:
            raise UsageError(
                "--standalone picks a free local port itself: drop --rdzv-endpoint, "
                "--master-addr and --master-port"
            )
    if args.rdzv_endpoint:
        host, sep, port = args.rdzv_endpoint.rpartition(":")
        if not sep or "]" in port:  # no port, or a bare IPv6 address
            host, port = args.rdzv_endpoint, str(_RDZV_DEFAULT_PORT)
        host = host.strip("[]")
        try:
            rport = int(port)
        except ValueError:
            raise UsageError(f"--rdzv-endpoint {args.rdzv_endpoint}: bad port {port!r}") from None
        if (master_addr not in (None, host)) or (master_port not in (None, rport)):
            raise UsageError(
                "--rdzv-endpoint and --master-addr/--master-port disagree: give one of them"
            )
        master_addr, master_port = host, rport
        if nnodes > 1 and args.node_rank is None:
            raise UsageError(
                "torchrun's c10d rendezvous numbers the nodes as they arrive; pycollective "
                "run needs each node's --node-rank (0 on the host of --rdzv-endpoint)"
            )
    if nnodes == 1 and master_addr in ("localhost", "127.0.0.1") and master_port is None:
        master_addr = None
    command_line(args.command, module=args.module, no_python=args.no_python)  # checks only
    return dict(
        nprocs=nprocs,
        cmd=args.command,
        module=args.module,
        no_python=args.no_python,
        nnodes=nnodes,
        node_rank=0 if args.node_rank is None else args.node_rank,
        master_addr=master_addr,
        master_port=master_port or 0,
        prefix=args.prefix,
        grace=args.grace,
        servers=args.servers,
        notice=args.notice,
        max_restarts=args.max_restarts,
        elastic=args.elastic,
        tls=args.tls,
    )


# --rdzv-conf keys for etcd -> the variable each rank reads (torchrun's names, and ours)
_ETCD_CONF = {
    "cacert": "PYCOLLECTIVE_ETCD_CACERT",
    "cert": "PYCOLLECTIVE_ETCD_CERT",
    "key": "PYCOLLECTIVE_ETCD_KEY",
    "user": "PYCOLLECTIVE_ETCD_USER",
    "password_file": "PYCOLLECTIVE_ETCD_PASSWORD_FILE",
}


def _etcd_options(args: argparse.Namespace, nprocs: int, nnodes: int) -> dict:
    """--rdzv-backend etcd: the ranks meet in etcd (no store on any node)."""
    if args.rdzv_backend.lower() == "etcd-v2":
        raise UsageError(
            "--rdzv-backend etcd-v2: etcd's v2 API is gone from etcd 3.6; pycollective "
            "speaks v3 (etcd >= 3.4): use --rdzv-backend etcd"
        )
    if not args.rdzv_endpoint:
        raise UsageError(
            "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT[,HOST:PORT...] (the etcd "
            "members, tried in turn)"
        )
    if args.master_addr or args.master_port or args.standalone:
        raise UsageError(
            "--rdzv-backend etcd: the ranks meet in etcd; drop --master-addr, --master-port "
            "and --standalone"
        )
    parse_endpoints(args.rdzv_endpoint)  # a bad endpoint is named here
    if nnodes > 1 and args.node_rank is None and args.elastic is None:
        raise UsageError(
            "--rdzv-backend etcd with --nnodes > 1 needs each node's --node-rank (ranks are "
            "numbered node by node), or --elastic MIN:MAX (members are numbered as they come)"
        )
    job = args.rdzv_id or "default"
    if "/" in job or not job.strip():
        raise UsageError(f"--rdzv-id {job!r}: a name without '/'")
    conf: dict[str, str] = {}
    for item in filter(None, (args.rdzv_conf or "").split(",")):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if key == "protocol" and value.strip() in ("http", "https"):
            continue  # torchrun's; the endpoints' scheme or a CA says it here
        if not sep or key not in _ETCD_CONF:
            raise UsageError(
                f"--rdzv-conf {item!r}: etcd takes {', '.join(k + '=' for k in _ETCD_CONF)}"
            )
        conf[_ETCD_CONF[key]] = os.path.abspath(value) if key != "user" else value
    command_line(args.command, module=args.module, no_python=args.no_python)
    return dict(
        nprocs=nprocs,
        cmd=args.command,
        module=args.module,
        no_python=args.no_python,
        nnodes=nnodes,
        node_rank=0 if args.node_rank is None else args.node_rank,
        master_addr=None,
        master_port=0,
        prefix=args.prefix,
        grace=args.grace,
        servers=args.servers,
        notice=args.notice,
        max_restarts=args.max_restarts,
        elastic=args.elastic,
        etcd=(args.rdzv_endpoint, job),
        etcd_env=conf,
    )


def command_line(cmd: Sequence[str], *, module: bool = False, no_python: bool = False) -> list[str]:
    """What each rank executes: torchrun's rules for -m and --no-python; otherwise a .py
    file (not executable) runs with this Python. A script that does not exist is named
    here, once, instead of by every rank."""
    cmd = list(cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no command to run (e.g. pycollective run -n 2 train.py)")
    if module and no_python:
        raise UsageError("-m/--module and --no-python cannot be used together")
    if module:
        return [sys.executable, "-m", *cmd]
    if no_python:
        return cmd
    script_at = None
    if cmd[0].endswith(".py"):
        script_at = 0
    elif os.path.basename(cmd[0]).startswith("python") and len(cmd) > 1:
        if not cmd[1].startswith("-"):
            script_at = 1  # python script.py ...
    if script_at is not None and not os.path.exists(cmd[script_at]):
        raise UsageError(f"no such script: {cmd[script_at]}")
    if script_at == 0 and not os.access(cmd[0], os.X_OK):
        cmd.insert(0, sys.executable)
    return cmd


def rank_environment(base: Mapping[str, str], nprocs: int) -> tuple[dict[str, str], str | None]:
    """torchrun's extra for every rank: OMP_NUM_THREADS=1 unless the user set it, and the
    note to print once (None if nothing was set)."""
    if "OMP_NUM_THREADS" in base or nprocs <= 1:
        return {}, None
    return {"OMP_NUM_THREADS": "1"}, _OMP_NOTE.format(n=nprocs)
