"""tools/nethosts.py: what a run builds, that it leaves nothing behind, and that `cleanup`
removes the leftovers of a run whose owner died. Needs root and `ip netns`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tools import nethosts

REPO = Path(__file__).resolve().parents[2]
_WHY = nethosts.available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"no namespace hosts: {_WHY}")


def _ours(prefix: str) -> list[str]:
    return [ns for ns in nethosts._namespaces() if ns.startswith(prefix)]


def test_hosts_reach_each_other_only_and_vanish_after():
    with nethosts.NetHosts(3, rate="1gbit") as hosts:
        assert sorted(_ours(hosts.prefix)) == sorted([*hosts.names, hosts.switch])
        probe = "import socket, sys; socket.create_connection((sys.argv[1], 9), timeout=2)"
        for k in range(3):
            # Only lo and eth0 with the host's own address; no default route.
            addrs = hosts.run(k, ["ip", "-o", "-4", "addr", "show"]).stdout
            assert f"inet {hosts.addrs[k]}/24" in addrs and addrs.count("inet ") == 2, addrs
            routes = hosts.run(k, ["ip", "route", "show"]).stdout
            assert "default" not in routes and routes.count("\n") == 1, routes
            assert hosts.run(k, ["hostname"]).stdout.strip() == hosts.names[k]
            # Names resolve inside (the host's /etc/hosts), nothing else does.
            res = hosts.run(k, ["getent", "hosts", hosts.names[(k + 1) % 3]])
            assert res.stdout.split()[0] == hosts.addrs[(k + 1) % 3], res
            # A peer host answers (connection refused: reached, nobody listens on port 9)...
            res = hosts.run(k, [sys.executable, "-c", probe, hosts.addrs[(k + 1) % 3]])
            assert "ConnectionRefusedError" in res.stderr, res.stderr
            # ... the rest of the world is unreachable (no route: nothing is sent).
            res = hosts.run(k, [sys.executable, "-c", probe, "192.0.2.1"])  # TEST-NET-1
            assert "Network is unreachable" in res.stderr, res.stderr
            # Shaped both ways: the host's egress and its switch port's egress.
            stats = hosts.qdisc_stats(k)
            assert stats.count("qdisc tbf") == 2 and stats.count("rate 1Gbit") == 2, stats
        # Both ways at once over the 1 Gbit/s links: nearly 1 Gbit/s each way, not half.
        duplex = nethosts.measure_duplex(hosts, 0, 1, 4 << 20, reps=3)
        assert 0.6e9 < duplex < 1.2e9, duplex
        sleeper = hosts.popen(0, ["sleep", "600"])
    assert sleeper.wait(timeout=10) != 0  # killed by the teardown
    assert _ours(hosts.prefix) == []
    assert not any(os.path.exists(os.path.join(nethosts.NETNS_ETC, n)) for n in hosts.names)


def test_cleanup_removes_the_namespaces_of_a_dead_owner():
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs
    name = f"{nethosts.NAME_PREFIX}{dead.pid}-test-h0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        with nethosts.NetHosts(1) as alive:
            removed = nethosts.cleanup()
            assert name in removed
            assert alive.names[0] not in removed  # our own run's owner lives
            assert sorted(_ours(alive.prefix)) == sorted([*alive.names, alive.switch])
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    assert name not in nethosts._namespaces()


def test_sigterm_tears_down():
    code = (
        "import sys, time; sys.path.insert(0, '.'); from tools import nethosts\n"
        "h = nethosts.NetHosts(2); h.up(); print(h.prefix, flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert proc.stdout is not None
    prefix = proc.stdout.readline().strip()
    assert prefix and len(_ours(prefix)) == 3
    proc.terminate()
    assert proc.wait(timeout=20) != 0
    assert _ours(prefix) == []
