"""The cross-host job of compare_peers.py: two network-namespace hosts (tools/nethosts.py,
unshaped veth links through one bridge), OpenMPI's mpirun starting the ranks on both
through an rsh agent that runs `ip netns exec`, pycollective (auto: TCP between hosts,
shared memory inside one), gloo and OpenMPI taking turns in the same ranks.

The reference is one plain TCP stream's goodput between the two hosts, measured in the
same run right before each job (nethosts.measure_link, both ways): a host's link carries
at least 2 (H-1)/H n bytes each way per all-reduce of n bytes, so with H = 2 hosts the
link's share is n / t over that goodput (the "link busbw", whatever the ranks per host).
Beside it, what the two hosts carry each way when they exchange both ways at once, one
process per host with plain sockets (nethosts.measure_duplex): an all-reduce's link does
that, and where the machine's cores, not a wire, carry the bytes (namespaces on one
machine), each core then does a sender's and a receiver's work.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools import nethosts  # noqa: E402

HOSTS = 2
# mpirun starts its daemon on another host as `<agent> <host> orted ...`, like ssh: the
# agent runs it in that host's namespaces, with that host's hostname (as tests/multihost).
AGENT = """#!/bin/sh
host="$1"; shift
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
"""


def why_not(mpirun: str | None) -> str | None:
    """None when the cross-host job can run here, else why not."""
    why = nethosts.available()
    if why:
        return why
    if mpirun is None:
        return "it is started by OpenMPI's mpirun, which is left out"
    return None


def write_launch_files(workdir: Path, hosts: nethosts.NetHosts, per_host: int) -> tuple[Path, Path]:
    """(the rsh agent, the hostfile) for mpirun, in `workdir` (private: the caller's)."""
    agent = workdir / "netns-agent"
    agent.write_text(AGENT)
    agent.chmod(0o700)
    hostfile = workdir / "hostfile"
    hostfile.write_text("".join(f"{n} slots={per_host}\n" for n in hosts.names))
    return agent, hostfile


def mpirun_command(
    mpirun: str,
    hosts: nethosts.NetHosts,
    per_host: int,
    agent: Path,
    hostfile: Path,
    port: int,
    worker: list[str],
    extra: list[str],
) -> list[str]:
    """mpirun across the hosts (run it in host 0): HOSTS x per_host ranks, by slot, so ranks
    0..per_host-1 are on host 0. Unbound: mpirun would bind each host's first rank to the
    same core, and the namespace hosts share this machine's cores."""
    subnet = f"{nethosts.SUBNET}.0/24"
    return [
        mpirun,
        "--allow-run-as-root",
        "--hostfile",
        str(hostfile),
        "-np",
        str(HOSTS * per_host),
        "--map-by",
        "slot",
        "--bind-to",
        "none",
        "--mca",
        "plm_rsh_agent",
        str(agent),
        "--mca",
        "oob_tcp_if_include",
        subnet,
        "--mca",
        "btl_tcp_if_include",
        subnet,
        *extra,
        "-x",
        f"MASTER_ADDR={hosts.addrs[0]}",
        "-x",
        f"MASTER_PORT={port}",
        "-x",
        "GLOO_SOCKET_IFNAME=eth0",
        "-x",
        "PYTHONUNBUFFERED",
        "-x",
        "PYTHONPATH",
        *worker,
    ]


def link_goodput(hosts: nethosts.NetHosts, nbytes: int = 256 << 20) -> dict[str, float]:
    """One TCP stream's goodput each way between host 0 and host 1, in bytes/s."""
    return {
        "0->1": nethosts.measure_link(hosts, 0, 1, nbytes) / 8,
        "1->0": nethosts.measure_link(hosts, 1, 0, nbytes) / 8,
    }


def duplex_goodput(hosts: nethosts.NetHosts, nbytes: int = 64 << 20) -> float:
    """Host 0 and host 1 exchanging nbytes both ways at once: bytes/s each way."""
    return nethosts.measure_duplex(hosts, 0, 1, nbytes) / 8


def link_share(time_us: float, nbytes: int, goodput: float) -> float:
    """The all-reduce's link busbw (n / t x 2 (H-1)/H) as a share of one stream's goodput."""
    return nbytes / (time_us * 1e-6) * 2 * (HOSTS - 1) / HOSTS / goodput


def spread(values: list[float]) -> dict[str, float] | None:
    """min, median and max of repeated runs' values (None if there are none)."""
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def fmt_spread(s: dict[str, float] | None, fmt: str = "{:.2f}") -> str:
    if s is None:
        return "-"
    med = fmt.format(s["median"])
    if s["min"] == s["max"]:
        return med
    return f"{med} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"


def private_dir() -> Path:
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="pycollective-xhost-"))
    os.chmod(d, 0o700)
    return d
