"""Test "hosts" made of Linux network namespaces, joined by a switch, optionally shaped.

    with NetHosts(3, rate="1gbit") as hosts:      # needs root and `ip netns`
        hosts.run(1, ["hostname"])                # runs in host 1's namespace
        hosts.addrs[0]                            # "10.77.0.1"

Layout of one run (prefix `pcn-<pid>-<hex>`, so parallel runs never collide):

    <prefix>-sw   the switch: a bridge br0 and one port p<k> per host (no address at all)
    <prefix>-h<k> host k: lo up, eth0 = 10.77.0.<k+1>/24, no default route

Nothing is created in the root namespace: every veth pair is made inside the switch
namespace with its host end moved straight into the host's namespace, so the 10.x
addresses exist only in namespaces this run made, and no host can reach anything but
the other hosts (no default route, no link to the outside).

With `rate` (e.g. "1gbit") each host's link is shaped in both directions with tbf, as a
switch port would be: egress on the host's eth0 (what the host sends) and egress on the
switch's port p<k> (what the host receives, from however many senders together). The
kernel here has no netem, so there is no delay or loss, only a rate.

Commands run in a host through `ip netns exec`, which also bind-mounts
/etc/netns/<host>/hosts (written here: every host's name and address) over /etc/hosts,
and a resolv.conf naming no reachable name server (lookups fail at once, not by timeout);
with `uts=True` (default) each command also gets its own UTS namespace whose hostname
is the host's name, so that launchers which tell nodes apart by hostname (OpenMPI) see
distinct hosts. Teardown kills what still runs in the namespaces and deletes them; it
runs on exit of the `with` block, at interpreter exit, and on SIGTERM/SIGHUP. A run that
was SIGKILLed leaves namespaces whose owner pid is gone: `python tools/nethosts.py
cleanup` removes those.

Command line:
    python tools/nethosts.py up N [--rate 1gbit]     # build, print, wait for Ctrl-C, tear down
    python tools/nethosts.py check N [--rate 1gbit]  # build, measure each link both ways
    python tools/nethosts.py cleanup [--all]         # remove leftovers of dead runs
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

NAME_PREFIX = "pcn-"
SUBNET = "10.77.0"
NETNS_ETC = "/etc/netns"
_TBF_BURST = "256kb"  # >= rate / timer frequency, so tbf can reach its rate
_TBF_LATENCY = "50ms"  # queue bound (about 6 MB at 1 Gbit/s): no drops for a few flows


class NetHostsError(RuntimeError):
    pass


def available() -> str | None:
    """None when namespace hosts can be built here, else the reason they cannot."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "building network namespaces needs root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"{NAME_PREFIX}probe-{os.getpid()}-{secrets.token_hex(2)}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode != 0:
        return f"`ip netns add` does not work here: {res.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise NetHostsError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
    return res


def _tc(ns: str, *args: str) -> None:
    cmd = ["ip", "netns", "exec", ns, "tc", *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise NetHostsError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")


def _namespaces() -> list[str]:
    res = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def _kill_and_delete(ns: str) -> None:
    """Kill every process still in namespace `ns` (all of them were started in it by us),
    then delete it and its /etc/netns entry."""
    for _ in range(20):
        res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        pids = [int(p) for p in res.stdout.split() if p.isdigit()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(NETNS_ETC)  # only if empty: other runs' entries stay


def _owner_pid(ns: str) -> int | None:
    parts = ns[len(NAME_PREFIX) :].split("-")
    return int(parts[0]) if parts and parts[0].isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup(everything: bool = False) -> list[str]:
    """Delete the namespaces of runs whose owner process is gone (all ours with
    `everything`); returns the names deleted."""
    gone = []
    for ns in _namespaces():
        if not ns.startswith(NAME_PREFIX):
            continue
        pid = _owner_pid(ns)
        if everything or pid is None or not _alive(pid):
            _kill_and_delete(ns)
            gone.append(ns)
    return gone


class NetHosts:
    """N namespace hosts on one switch; a context manager that always tears down."""

    def __init__(
        self,
        n: int,
        *,
        rate: str | None = None,
        uts: bool = True,
        burst: str = _TBF_BURST,
    ) -> None:
        if not 1 <= n <= 200:
            raise ValueError(f"host count must be in 1..200, got {n}")
        self.n = n
        self.rate = rate
        self.uts = uts
        self.burst = burst
        self.prefix = f"{NAME_PREFIX}{os.getpid()}-{secrets.token_hex(2)}"
        self.switch = f"{self.prefix}-sw"
        self.names = [f"{self.prefix}-h{k}" for k in range(n)]
        self.addrs = [f"{SUBNET}.{k + 1}" for k in range(n)]
        self._up = False
        self._old_handlers: dict[int, Any] = {}
        self._procs: list[subprocess.Popen] = []  # started by popen(), killed at teardown

    # ------------------------------------------------------------------ building

    def __enter__(self) -> NetHosts:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def up(self) -> None:
        if self._up:
            return
        self._up = True  # from here on, close() has something to undo
        atexit.register(self.close)
        self._install_signal_handlers()
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        sw = self.switch
        _ip("netns", "add", sw)
        _ip("link", "set", "lo", "up", ns=sw)
        _ip("link", "add", "br0", "type", "bridge", ns=sw)
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{a} {h}\n" for a, h in zip(self.addrs, self.names, strict=True)
        )
        for k, host in enumerate(self.names):
            _ip("netns", "add", host)
            os.makedirs(os.path.join(NETNS_ETC, host), exist_ok=True)
            with open(os.path.join(NETNS_ETC, host, "hosts"), "w") as f:
                f.write(hosts_file)
            # No name server inside: a lookup that /etc/hosts cannot answer fails at once
            # (loopback refuses port 53) instead of timing out towards the machine's server.
            with open(os.path.join(NETNS_ETC, host, "resolv.conf"), "w") as f:
                f.write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
            port = f"p{k}"
            _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host, ns=sw)
            _ip("link", "set", port, "master", "br0", ns=sw)
            _ip("link", "set", port, "up", ns=sw)
            _ip("link", "set", "lo", "up", ns=host)
            _ip("addr", "add", f"{self.addrs[k]}/24", "dev", "eth0", ns=host)
            _ip("link", "set", "eth0", "up", ns=host)
            if self.rate:
                for ns, dev in ((host, "eth0"), (sw, port)):
                    _tc(ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", self.rate,
                        "burst", self.burst, "latency", _TBF_LATENCY)  # fmt: skip
        _ip("link", "set", "br0", "up", ns=sw)
        self._wait_for_links()

    def _wait_for_links(self, timeout: float = 10.0) -> None:
        """Bridge ports start in the forwarding state at once (no STP), but the veths
        take a moment to report carrier; wait until every link is up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            res = _ip("-o", "link", "show", "master", "br0", ns=self.switch)
            if res.stdout.count("LOWER_UP") >= self.n:
                return
            time.sleep(0.02)
        raise NetHostsError(f"switch ports of {self.prefix} did not come up in {timeout} s")

    def _install_signal_handlers(self) -> None:
        if sys.platform != "linux":
            return
        try:
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        except ValueError:  # not the main thread: atexit and the with block still run
            self._old_handlers.clear()

    def _on_signal(self, signum: int, frame: object) -> None:
        self.close()
        old = self._old_handlers.get(signum)
        if callable(old):
            old(signum, frame)
        raise SystemExit(128 + signum)

    def close(self) -> None:
        """Kill whatever still runs in the hosts and delete every namespace of this run."""
        if not self._up:
            return
        self._up = False
        # A process popen() started may not have entered its namespace yet, where the
        # namespace's pid list would find it: kill it by its own pid first.
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.kill()
        self._procs.clear()
        for name in [*self.names, self.switch]:
            _kill_and_delete(name)
        for sig, handler in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
        self._old_handlers.clear()
        atexit.unregister(self.close)

    # ------------------------------------------------------------------ running things

    def command(self, k: int, argv: Sequence[str]) -> list[str]:
        """The argv that runs `argv` on host k (in its network and, with uts, UTS namespace)."""
        if not 0 <= k < self.n:
            raise ValueError(f"host {k} is not in 0..{self.n - 1}")
        argv = [str(a) for a in argv]
        prefix = ["ip", "netns", "exec", self.names[k]]
        if self.uts:
            # A new UTS namespace per command: same hostname for every process of host k.
            prefix += ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', self.names[k]]
        return prefix + argv

    def run(
        self, k: int, argv: Sequence[str], timeout: float = 60, check: bool = False, **kw: Any
    ) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.command(k, argv), timeout=timeout, check=check, **kw)

    def popen(
        self, k: int, argv: Sequence[str], env: Mapping[str, str] | None = None, **kw: Any
    ) -> subprocess.Popen:
        proc = subprocess.Popen(self.command(k, argv), env=None if env is None else dict(env), **kw)
        self._procs = [p for p in self._procs if p.poll() is None] + [proc]
        return proc

    def qdisc_stats(self, k: int) -> str:
        """tc's statistics of host k's two shapers (egress, then the switch port)."""
        out = [self.run(k, ["tc", "-s", "qdisc", "show", "dev", "eth0"]).stdout]
        res = subprocess.run(["ip", "netns", "exec", self.switch, "tc", "-s", "qdisc", "show",
                              "dev", f"p{k}"], capture_output=True, text=True)  # fmt: skip
        return "".join(out) + res.stdout


# ---------------------------------------------------------------------- link measurement

_RECEIVER = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(30)
print("ready", flush=True)
c, _ = s.accept(); c.settimeout(30); buf = bytearray(1 << 20); got = 0; t0 = None
while True:
    k = c.recv_into(buf)
    if t0 is None: t0 = time.perf_counter()
    if not k: break
    got += k
t = time.perf_counter() - t0
c.sendall(b"x"); print(f"{got} {t}", flush=True)
"""

_SENDER = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
buf = memoryview(bytearray(1 << 20)); n = int(sys.argv[3])
for _ in range(n >> 20): c.sendall(buf)
c.shutdown(socket.SHUT_WR); c.recv(1)
"""


# One process per host that sends `n` bytes to the other (on a thread) while it receives
# as many, `reps` times after a one-byte handshake each; it prints its times.
_DUPLEX = r"""
import socket, sys, threading, time
role, addr = sys.argv[1], sys.argv[2]
port, n, reps = (int(v) for v in sys.argv[3:6])
if role == "listen":
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port)); ls.listen(1); ls.settimeout(30)
    print("ready", flush=True); s, _ = ls.accept()
else:
    s = socket.create_connection((addr, port), timeout=30)
s.settimeout(60)
out, into = memoryview(bytearray(n)), memoryview(bytearray(n))
times = []
for _ in range(reps):
    s.sendall(b"g"); assert s.recv(1) == b"g"
    t0 = time.perf_counter()
    sender = threading.Thread(target=s.sendall, args=(out,)); sender.start()
    got = 0
    while got < n:
        k = s.recv_into(into[got:])
        if not k: raise SystemExit("peer closed")
        got += k
    sender.join()
    times.append(time.perf_counter() - t0)
print(" ".join(f"{t:.6f}" for t in times), flush=True)
"""


@contextlib.contextmanager
def _listening(hosts: NetHosts, k: int, script: str, args: Sequence[str], what: str):
    """A measurement's listening side on host k: `script` run with `args`, started once it
    printed "ready"; killed on the way out if it has not ended."""
    proc = hosts.popen(k, [sys.executable, "-c", script, *args],
                       stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise NetHostsError(f"{what}: the listening side did not start")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def measure_duplex(
    hosts: NetHosts, a: int, b: int, nbytes: int = 64 << 20, reps: int = 5, port: int = 5202
) -> float:
    """Goodput in bit/s each way of hosts `a` and `b` exchanging `nbytes` both ways at
    once over one connection, one process per host (plain sockets, the median of `reps`
    exchanges): what a two-host all-reduce's link does, with nothing else (no reduction,
    no framing), where the hosts' CPUs rather than a wire carry the bytes, as between
    namespaces on one machine's cores."""
    args = [hosts.addrs[b], str(port), str(nbytes), str(reps)]
    with _listening(hosts, b, _DUPLEX, ["listen", *args], "duplex measurement") as listener:
        out = hosts.run(a, [sys.executable, "-c", _DUPLEX, "connect", *args], timeout=120,
                        check=True).stdout  # fmt: skip
        listener.communicate(timeout=30)
    times = sorted(float(t) for t in out.split())
    return nbytes * 8 / times[len(times) // 2]


def measure_link(
    hosts: NetHosts, src: int, dst: int, nbytes: int = 128 << 20, port: int = 5201
) -> float:
    """Goodput in bit/s of one TCP stream from host `src` to host `dst` (plain sockets),
    timed at the receiver from its first byte to the sender's close."""
    args = [hosts.addrs[dst], str(port)]
    with _listening(hosts, dst, _RECEIVER, args, "link measurement") as recv:
        hosts.run(src, [sys.executable, "-c", _SENDER, *args, str(nbytes)],
                  timeout=120, check=True)  # fmt: skip
        got, seconds = recv.communicate(timeout=30)[0].split()
    return int(got) * 8 / float(seconds)


def _main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("up", "check"):
        p = sub.add_parser(name)
        p.add_argument("n", type=int)
        p.add_argument("--rate", default=None, help='tbf rate per link and direction, e.g. "1gbit"')
    c = sub.add_parser("cleanup", help="remove the namespaces of runs whose owner is gone")
    c.add_argument("--all", action="store_true", help="remove every run's namespaces")
    args = ap.parse_args(argv)
    if args.cmd == "cleanup":
        for ns in cleanup(args.all):
            print(f"removed {ns}")
        return 0
    reason = available()
    if reason:
        print(f"nethosts: {reason}", file=sys.stderr)
        return 2
    with NetHosts(args.n, rate=args.rate) as hosts:
        for name, addr in zip(hosts.names, hosts.addrs, strict=True):
            print(f"{name} {addr}   (ip netns exec {name} ...)")
        if args.cmd == "check":
            # Each link of a ring of hosts, both ways (2 hosts: one pair).
            for a in range(hosts.n if hosts.n > 2 else hosts.n - 1):
                b = (a + 1) % hosts.n
                for s, d in ((a, b), (b, a)):
                    bps = measure_link(hosts, s, d)
                    print(f"host {s} -> host {d}: {bps / 1e9:.3f} Gbit/s")
                bps = measure_duplex(hosts, a, b)
                print(f"host {a} <-> host {b}, both ways at once: {bps / 1e9:.3f} Gbit/s each way")
            return 0
        print("up; Ctrl-C tears down")
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(_main())
