"""TCPStore and TCPStoreServer with real sockets and processes: auth, bad peers, deaths."""

from __future__ import annotations

import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from pycollective._auth import HELLO_BYTES, MAGIC, connect_handshake
from pycollective._errors import AuthenticationError, UsageError
from pycollective.store import MAX_VALUE_BYTES, StoreError, TCPStore, TCPStoreServer

SECRET = b"test-secret"  # the `server` fixture's (conftest.py)

pytestmark = pytest.mark.timeout(30)


def _python(code: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _raw_authenticated(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    connect_handshake(sock, SECRET, b"store", 5)
    return sock


def _closed_by_server(sock: socket.socket, within: float = 3.0) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    finally:
        sock.close()


def _store_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pycollective-store")]


def test_processes_rendezvous_through_the_store(server):
    n = 4
    code = """
        import os
        from pycollective.store import TCPStore
        rank, n = int(os.environ["RANK"]), int(os.environ["N"])
        s = TCPStore("127.0.0.1", int(os.environ["PORT"]), os.environ["SECRET"], timeout=10)
        s.add("arrived", 1)
        s.set(f"addr{rank}", f"host-{rank}")
        s.wait([f"addr{r}" for r in range(n)])
        print(",".join(s.get(f"addr{r}").decode() for r in range(n)))
        # released only once the parent, a different process, says so
        print(s.get("go").decode())
    """
    procs = [
        _python(code, RANK=str(r), N=str(n), PORT=str(server.port), SECRET=SECRET.decode())
        for r in range(n)
    ]
    parent = TCPStore("127.0.0.1", server.port, SECRET, timeout=10)
    parent.wait([f"addr{r}" for r in range(n)])
    assert parent.get("arrived") == str(n).encode()
    parent.set("go", "released")
    for p in procs:
        out, err = p.communicate(timeout=15)
        assert p.returncode == 0, err
        assert out.splitlines() == [",".join(f"host-{r}" for r in range(n)), "released"]
    parent.close()


def test_wrong_secret_is_refused_while_a_good_client_keeps_working(server, caplog):
    good = TCPStore("127.0.0.1", server.port, SECRET, timeout=10)
    result: list[bytes] = []
    waiter = threading.Thread(target=lambda: result.append(good.get("k")))
    waiter.start()  # a blocking get in flight while the bad client knocks
    with caplog.at_level(logging.WARNING, logger="pycollective.store"):
        with pytest.raises(AuthenticationError, match="127.0.0.1"):
            TCPStore("127.0.0.1", server.port, b"wrong", timeout=5)
        with pytest.raises(UsageError, match="empty"):  # no key anyone can compute
            TCPStore("127.0.0.1", server.port, b"", timeout=5)
    for _ in range(100):  # the server logs after it answered us
        if "refused" in caplog.text:
            break
        time.sleep(0.02)
    assert "refused" in caplog.text
    other = TCPStore("127.0.0.1", server.port, SECRET, timeout=10)
    other.set("k", "v")
    waiter.join(5)
    assert result == [b"v"]
    assert good.add("n", 1) == 1
    good.close()
    other.close()


def test_garbage_before_the_handshake_is_refused(server, caplog):
    good = TCPStore("127.0.0.1", server.port, SECRET, timeout=5)
    with caplog.at_level(logging.WARNING, logger="pycollective.store"):
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        hello = raw.recv(HELLO_BYTES)
        assert hello.startswith(MAGIC)
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 40)
        assert _closed_by_server(raw)
    assert "refused connection" in caplog.text
    good.set("still", "fine")
    assert good.get("still") == b"fine"
    good.close()


@pytest.mark.parametrize(
    "frame, why",
    [
        (struct.pack("!BIq", 99, 0, -1), "unknown op"),
        (struct.pack("!BIq", 1, 7, -1), "arguments"),  # SET with 7 args
        (struct.pack("!BIq", 2, 1, -5), "timeout"),
        # SET whose key claims 4 GiB: refused from the length field, nothing allocated
        (struct.pack("!BIqI", 1, 2, -1, 0xFFFFFFFF), "limit"),
        # SET whose value claims one byte over the limit
        (
            struct.pack("!BIqI", 1, 2, -1, 1) + b"k" + struct.pack("!I", MAX_VALUE_BYTES + 1),
            "limit",
        ),
        (struct.pack("!BIq", 5, 2**31, -1), "arguments"),  # WAIT on 2^31 keys
    ],
)
def test_bad_frames_after_the_handshake_close_only_that_connection(server, caplog, frame, why):
    good = TCPStore("127.0.0.1", server.port, SECRET, timeout=5)
    good.set("before", "1")
    with caplog.at_level(logging.WARNING, logger="pycollective.store"):
        raw = _raw_authenticated(server.port)
        raw.sendall(frame)
        assert _closed_by_server(raw)
    assert "bad frame" in caplog.text and why in caplog.text
    assert good.get("before") == b"1"
    assert good.add("after", 2) == 2
    good.close()


def test_silent_peer_is_dropped_after_the_handshake_timeout():
    with TCPStoreServer("127.0.0.1", 0, SECRET, handshake_timeout=0.3) as srv:
        raw = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        good = TCPStore("127.0.0.1", srv.port, SECRET, timeout=5)  # not held up by it
        good.set("a", "1")
        raw.recv(HELLO_BYTES)
        assert _closed_by_server(raw, within=3)
        assert good.get("a") == b"1"
        good.close()


def test_client_enforces_value_limit(server):
    s = TCPStore("127.0.0.1", server.port, SECRET, timeout=5)
    big = os.urandom(1 << 20)
    s.set("big", big)
    assert s.get("big") == big
    from pycollective._errors import UsageError

    with pytest.raises(UsageError):
        s.set("huge", b"\x00" * (MAX_VALUE_BYTES + 1))
    assert s.num_keys() == 1
    s.close()


def test_server_process_death_fails_blocked_and_later_calls():
    srv = _python(
        """
        import sys, time
        from pycollective.store import TCPStoreServer
        srv = TCPStoreServer("127.0.0.1", 0, sys.argv[1] if len(sys.argv) > 1 else "s").start()
        print(srv.port, flush=True)
        time.sleep(60)
        """
    )
    try:
        port = int(srv.stdout.readline())
        client = TCPStore("127.0.0.1", port, "s", timeout=60)
        client.set("x", "1")
        errors: list[BaseException] = []

        def blocked() -> None:
            try:
                client.get("never-set")
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=blocked)
        t.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        srv.send_signal(signal.SIGKILL)
        t.join(10)
        assert not t.is_alive()
        assert time.monotonic() - t0 < 5
        assert len(errors) == 1 and isinstance(errors[0], StoreError), errors
        with pytest.raises(StoreError):
            client.set("y", "2")
        client.close()
    finally:
        srv.kill()
        srv.communicate()


def test_server_close_releases_clients_sockets_and_threads():
    before = len(_store_threads())
    srv = TCPStoreServer("127.0.0.1", 0, SECRET).start()
    port = srv.port
    clients = [TCPStore("127.0.0.1", port, SECRET, timeout=30) for _ in range(3)]
    errors: list[BaseException] = []

    def blocked(c: TCPStore) -> None:
        try:
            c.wait(["never"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=blocked, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    time.sleep(0.2)
    srv.close()
    for t in threads:
        t.join(5)
    assert len(errors) == 3 and all(isinstance(e, StoreError) for e in errors)
    assert len(_store_threads()) == before
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    srv.close()  # idempotent
    for c in clients:
        c.close()


def test_client_retries_until_the_server_is_up():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    servers: list[TCPStoreServer] = []
    threading.Timer(
        0.3, lambda: servers.append(TCPStoreServer("127.0.0.1", port, SECRET).start())
    ).start()
    t0 = time.monotonic()
    client = TCPStore("127.0.0.1", port, SECRET, timeout=10)
    assert time.monotonic() - t0 >= 0.25
    client.set("k", "v")
    assert client.get("k") == b"v"
    client.close()
    servers[0].close()


def test_connect_timeout_raises_store_error():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=f"127.0.0.1:{port}"):
        TCPStore("127.0.0.1", port, SECRET, timeout=30, connect_timeout=0.5)
    assert time.monotonic() - t0 < 3


def test_is_master_hosts_the_server():
    master = TCPStore.create("127.0.0.1", 0, True, SECRET, timeout=5)
    assert master.server is not None and master.port == master.server.port
    worker = TCPStore("127.0.0.1", master.port, SECRET, timeout=5)
    worker.set("hello", "world")
    assert master.get("hello") == b"world"
    master.close()
    with pytest.raises(StoreError):
        worker.get("hello")
    worker.close()


def test_server_stops_waiting_for_a_client_that_hung_up(server):
    client = TCPStore("127.0.0.1", server.port, SECRET, timeout=None)
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            client.get("never")
        except StoreError as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.2)
    assert len(server._conns) == 1
    client.close()
    deadline = time.monotonic() + 5
    while server._conns and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server._conns  # the server thread parked in `get` noticed and left
    t.join(5)
    assert len(errors) == 1


def test_a_lease_ends_with_its_connection_even_when_the_process_is_killed(server):
    watcher = TCPStore("127.0.0.1", server.port, SECRET, timeout=5)
    holder = TCPStore("127.0.0.1", server.port, SECRET, timeout=5)
    holder.set_lease("lease/a", "1")
    assert watcher.check(["lease/a"])
    holder.close()
    deadline = time.monotonic() + 3
    while watcher.check(["lease/a"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not watcher.check(["lease/a"])
    # a lease set again by someone else is not removed by the old holder's end
    holder = TCPStore("127.0.0.1", server.port, SECRET, timeout=5)
    holder.set_lease("lease/b", "1")
    watcher.set("lease/b", "2")
    holder.close()
    time.sleep(0.2)
    assert watcher.get("lease/b") == b"2"
    # kill -9: the kernel closes the socket, the lease ends within milliseconds
    proc = _python(
        f"""
        import sys, time
        from pycollective.store import TCPStore
        s = TCPStore("127.0.0.1", {server.port}, {SECRET!r}, timeout=5)
        s.set_lease("lease/c", "pid")
        print("held", flush=True)
        time.sleep(60)
        """
    )
    assert proc.stdout.readline().strip() == "held"
    assert watcher.check(["lease/c"])
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t0 = time.monotonic()
    while watcher.check(["lease/c"]) and time.monotonic() - t0 < 3:
        time.sleep(0.005)
    assert not watcher.check(["lease/c"]) and time.monotonic() - t0 < 1.0
    watcher.close()
