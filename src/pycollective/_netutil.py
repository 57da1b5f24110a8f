"""Which local address a rank should listen on and advertise to its peers."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import random
import socket
import struct

from ._errors import UsageError

_SIOCGIFADDR = 0x8915


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
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
            return s.getsockname()[0]
        except OSError as exc:
            raise UsageError(f"cannot find a route to MASTER_ADDR={host!r}: {exc}") from None


def listen_address(master_addr: str, multi_node: bool) -> tuple[str, str]:
    """(bind address, advertised address) for this rank's transport listener."""
    ifname = os.environ.get("PYCOLLECTIVE_SOCKET_IFNAME")
    if ifname:
        addr = interface_address(ifname)
        return addr, addr
    if is_loopback(master_addr) and not multi_node:
        return "127.0.0.1", "127.0.0.1"
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
