"""Every port the library listens on admits only peers that prove the job's key: the
store a rank hosts, the launcher's store, an elastic job's store host, and a rank's mesh
listener while the mesh forms (the parameter server and elastic training listen on
nothing else). Ports are bound to the address asked for, and a port squatted before the
job starts makes the job fail at once, naming why.

Findings 1, 6 and 9 of the security review.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from tests._launch import REPO, run_ranks

from pycollective._errors import AuthenticationError
from pycollective._netutil import free_port
from pycollective.store import TCPStore, TCPStoreServer

pytestmark = pytest.mark.timeout(90)
WORKER = REPO / "tests" / "security" / "_attack_worker.py"
WRONG = b"not-this-jobs-key-" + os.urandom(8).hex().encode()


def _knock(port: int) -> None:
    """What an outsider tries: a client with another key, and raw junk."""
    with pytest.raises(AuthenticationError):
        TCPStore("127.0.0.1", port, WRONG, timeout=5)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.recv(64)
        s.sendall(os.urandom(200))
        s.settimeout(5)
        try:
            while s.recv(4096):
                pass
        except ConnectionResetError:
            pass


def test_the_store_binds_the_address_asked_for() -> None:
    store = TCPStore("127.0.0.2", 0, b"a-key-for-this-test-only", is_master=True, timeout=5)
    try:
        assert store.server is not None
        assert store.server._listener.getsockname()[0] == "127.0.0.2"
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", store.port), timeout=2).close()
    finally:
        store.close()


def test_the_launchers_store_admits_only_the_job(tmp_path) -> None:
    port = free_port()
    go = tmp_path / "go"
    code = textwrap.dedent(
        f"""
        import os, time, pycollective as dist
        while not os.path.exists({str(go)!r}):
            time.sleep(0.05)
        dist.init_process_group()
        import numpy as np
        x = np.ones(4)
        dist.all_reduce(x)
        print("sum", x[0], flush=True)
        dist.destroy_process_group()
        """
    )
    job = subprocess.Popen(
        [sys.executable, "-m", "pycollective", "run", "-n", "2", "--master-port", str(port)]
        + [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        _knock(port)
        go.write_text("")
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err
    assert out.count("sum 2.0") == 2, out


def test_an_elastic_store_host_admits_only_the_job() -> None:
    port = free_port()
    host = subprocess.Popen(
        [sys.executable, "-m", "pycollective.elastic._storehost", "127.0.0.1", str(port), "5"]
    )
    try:
        good = TCPStore("127.0.0.1", port, None, timeout=5, connect_timeout=20)
        _knock(port)
        good.set("still", "ok")
        assert good.get("still") == b"ok"
        good.close()
    finally:
        host.kill()
        host.wait()


def test_a_ranks_store_admits_only_the_job() -> None:
    """Rank 0 hosts the store of a job started by hand (MASTER_ADDR/MASTER_PORT); an
    outsider knocks while the ranks meet."""
    port = free_port()
    import threading

    knocked: list[BaseException | None] = []

    def knock_when_up() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.02)
        try:
            _knock(port)
            knocked.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            knocked.append(exc)

    t = threading.Thread(target=knock_when_up)
    t.start()
    results = run_ranks(
        WORKER, 2, ("allreduce",), env={"MASTER_PORT": str(port), "KEEP_STORE": "1"}
    )
    t.join(40)
    for r in results:
        assert r.returncode == 0, r.stderr
    assert knocked == [None], knocked


@pytest.mark.timeout(60)
def test_a_squatted_store_port_fails_the_job_at_once() -> None:
    """Another user's program (here: a store with another key) holds MASTER_PORT before
    the job starts: rank 0 cannot listen there and says so, the others refuse the squatter
    at its first handshake; nobody waits for the 60 s timeout."""
    squatter = TCPStoreServer("127.0.0.1", 0, WRONG).start()
    try:
        t0 = time.monotonic()
        results = run_ranks(
            WORKER, 3, ("allreduce",), env={"MASTER_PORT": str(squatter.port)}, timeout=50
        )
        elapsed = time.monotonic() - t0
    finally:
        squatter.close()
    assert all(r.returncode != 0 for r in results)
    assert "cannot listen" in results[0].stderr, results[0].stderr[-2000:]
    for r in results[1:]:
        assert "key differs" in r.stderr, r.stderr[-2000:]
    assert elapsed < 40
    assert squatter.connections == 0


def test_a_torch_store_rewritten_by_an_outsider_is_caught() -> None:
    """torchrun's agent store is torch's TCPStore, which authenticates nobody: what ranks
    put there is signed with the job's key, so a rewritten address or cost parameter is an
    error naming the key instead of a rank dialing wherever it was told."""
    torch_dist = pytest.importorskip("torch.distributed")
    from pycollective import _keys
    from pycollective._errors import StoreError
    from pycollective.core.rendezvous import TorchStoreAdapter

    raw = torch_dist.HashStore()
    ours = TorchStoreAdapter(raw, "job", "torchrun's store")
    ours.sign(_keys.JobKey(b"a-key-for-this-test-only", "test"))
    ours.set("tcp/0", b"10.0.0.1:4000")
    assert ours.get("tcp/0") == b"10.0.0.1:4000"
    raw.set("job/tcp/0", b"10.6.6.6:4000")  # the outsider
    with pytest.raises(StoreError, match="not signed with the job's secret"):
        ours.get("tcp/0")
    ours.set("tcp/1", b"10.0.0.2:4000")
    raw.set("job/tcp/0", raw.get("job/tcp/1"))  # a real value, moved to another key
    with pytest.raises(StoreError, match="fails its signature check"):
        ours.get("tcp/0")
