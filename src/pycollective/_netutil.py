"""Which local address a rank should listen on and advertise to its peers."""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import logging
import random
import socket
import struct
import time

from . import _config
from ._errors import UsageError

_SIOCGIFADDR = 0x8915
log = logging.getLogger("pycollective.net")
# Failures that only mean "not listening yet": retried without a word in the log.
_STARTING = (errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT, None)


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def both_ends_loopback(sock: socket.socket) -> bool:
    """Whether both ends of connected `sock` are loopback addresses (unlike is_loopback,
    False for a socket that is not IP, such as a Unix socket pair, or whose addresses
    cannot be read)."""
    try:
        ends = (sock.getsockname(), sock.getpeername())
        return all(ipaddress.ip_address(end[0]).is_loopback for end in ends)
    except (OSError, ValueError, IndexError, TypeError):
        return False


def interface_address(ifname: str) -> str:
    """The IPv4 address of network interface `ifname` (e.g. "eth0")."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(
                s.fileno(), _SIOCGIFADDR, struct.pack("256s", ifname[:15].encode())
            )
        except OSError as exc:
            raise UsageError(
                f"PYCOLLECTIVE_SOCKET_IFNAME={ifname!r}: no IPv4 address ({exc})"
            ) from None
    return socket.inet_ntoa(packed[20:24])


def address_towards(host: str) -> str:
    """The local address the kernel would use to reach `host`. A UDP connect sends nothing;
    it only asks the routing table, which works where hostnames do not resolve."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((socket.gethostbyname(host), 9))
            address: str = s.getsockname()[0]
            return address
        except OSError as exc:
            raise UsageError(f"cannot find a route to MASTER_ADDR={host!r}: {exc}") from None


def listen_address(master_addr: str | None, multi_node: bool) -> tuple[str, str]:
    """(bind address, advertised address) for this rank's transport listener.

    `master_addr` is where the job meets (MASTER_ADDR, the host of a tcp:// init address,
    the host of the store; None when unknown). PYCOLLECTIVE_SOCKET_IFNAME names the
    interface outright; else a job on one host listens on loopback, and any other on the
    interface that routes to `master_addr`. A job that spans hosts with no such address
    (none known, or a loopback one) is refused at once, naming the fix: a loopback address
    advertised to other hosts would make their connections fail far from the cause."""
    ifname = _config.get("PYCOLLECTIVE_SOCKET_IFNAME")
    if ifname:
        addr = interface_address(ifname)
        return addr, addr
    if master_addr is None or is_loopback(master_addr):
        if not multi_node:
            return "127.0.0.1", "127.0.0.1"
        raise UsageError(
            "this job spans hosts, but its rendezvous address is "
            f"{'not known' if master_addr is None else repr(master_addr) + ' (loopback)'}, so "
            "there is no interface to advertise to the other hosts: set "
            "PYCOLLECTIVE_SOCKET_IFNAME=<the interface that reaches them> (e.g. eth0), or "
            "rendezvous at a routable address of rank 0's host (MASTER_ADDR=<address>, or "
            "init_method='tcp://<address>:<port>')"
        )
    addr = address_towards(master_addr)
    return addr, addr


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range (32768+), so listeners that
    bind port 0 cannot take it between this check and its use (e.g. as MASTER_PORT)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


def connect_with_retry(
    host: str, port: int, deadline: float | None, attempt_timeout: float = 5.0
) -> socket.socket:
    """A TCP connection to host:port, retried with a capped backoff (10 ms doubling to
    0.5 s) while the other side may still be starting: refused, reset, unreachable or not
    resolvable yet. `deadline` is a time.monotonic() value (None: no limit). Past it, the
    last OSError is raised for the caller to turn into its own error (TransportError,
    StoreError), naming what it was connecting to."""
    delay = 0.01
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        timeout = (
            attempt_timeout if remaining is None else max(0.1, min(remaining, attempt_timeout))
        )
        try:
            return socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise
            if exc.errno not in _STARTING:
                log.debug("connect to %s:%s failed: %s; retrying", host, port, exc)
            time.sleep(delay if remaining is None else min(delay, remaining))
            delay = min(delay * 2, 0.5)
