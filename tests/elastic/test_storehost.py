"""The store host an elastic job started by hand runs (elastic/_storehost.py): it forgets
a job once its last client left, exits when idle, and steps aside when the port is taken."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from pycollective._netutil import free_port
from pycollective.store import TCPStore, TCPStoreServer

pytestmark = pytest.mark.timeout(60)


def _host(port: int, idle: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pycollective.elastic._storehost", "127.0.0.1", str(port),
         str(idle)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_forgets_the_job_when_its_last_client_left_then_exits_when_idle():
    port = free_port()
    proc = _host(port, 1.5)
    try:
        a = TCPStore("127.0.0.1", port, None, timeout=5, connect_timeout=20)
        b = TCPStore("127.0.0.1", port, None, timeout=5)
        a.set("elastic/job/done", "7")
        a.close()
        time.sleep(0.6)
        assert b.get("elastic/job/done") == b"7"  # a client is still there: kept
        b.close()
        time.sleep(0.8)
        c = TCPStore("127.0.0.1", port, None, timeout=5)
        assert not c.check(["elastic/job/done"])  # nobody was left: forgotten
        c.close()
        assert proc.wait(timeout=10) == 0  # idle: gone
    finally:
        proc.kill()
        proc.wait()


def test_steps_aside_when_the_port_is_taken():
    server = TCPStoreServer("127.0.0.1", 0).start()
    try:
        proc = _host(server.port, 30)
        assert proc.wait(timeout=20) == 0
    finally:
        server.close()
