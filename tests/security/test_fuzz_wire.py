"""The fuzzers' inputs against a real job: the store server of a running 2-rank job gets
every input of the store's and the handshake's fuzz corpus (fuzz/corpus: seeds from real
traffic and the inputs the fuzzers found), before the handshake and from an authenticated
client, while the job loops checked all_reduces and store operations on it. Nothing
crashes, the server keeps serving, memory stays bounded and the job's results stay right.

The fuzzing itself is fuzz/'s (atheris, one target per parser: tests/security/
test_fuzz_targets.py, `make fuzz`); the targets run the server's connection loop in their
own process, this runs the real server's threads beside a real job. A real job's
transport cannot be reached from outside at all: its listener closes once the mesh is up
(test_a_formed_mesh_accepts_no_connections); its receive path is fuzzed beside a working
group by the transport_frames target.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
from collections import Counter

import pytest
from tests._launch import REPO

from pycollective import _auth
from pycollective._errors import AuthenticationError
from pycollective.store import TCPStore, TCPStoreServer

SECRET = b"fuzz-secret-" + os.urandom(8).hex().encode()
CORPUS = REPO / "fuzz" / "corpus"
COUNTS: Counter[str] = Counter()
RSS_GROWTH_LIMIT = 64 << 20  # bytes the process may grow in all


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


# ---------------------------------------------------------------------- the job beside


@pytest.fixture(scope="module")
def side_job():
    """A store server in this process and a 2-rank job that uses it (rendezvous, then a
    loop of checked all_reduces and store operations) while the tests attack the server."""
    server = TCPStoreServer("127.0.0.1", 0, secret=SECRET).start()
    env = dict(os.environ)
    env.update(
        WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.port),
        PYCOLLECTIVE_STORE_HOSTED="1", PYCOLLECTIVE_SECRET=SECRET.decode(),
        PYCOLLECTIVE_TIMEOUT="120", PYTHONUNBUFFERED="1",
    )  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "security" / "_side_worker.py")],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(2)
    ]
    client = TCPStore("127.0.0.1", server.port, secret=SECRET, timeout=60)
    state = {"server": server, "procs": procs, "client": client, "rss0": _rss()}
    client.wait(["side/count/0", "side/count/1"], timeout=60)  # the loop is running
    try:
        yield state
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.communicate()
        client.close()
        server.close()


def _store_still_serves(state) -> None:
    client = state["client"]
    n = client.add("fuzz/alive", 1)
    assert int(client.get("fuzz/alive")) == n


# ---------------------------------------------------------------------- the store


def _seeds(target: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted((CORPUS / target).iterdir()) if p.is_file()]


def _send_and_drain(s: socket.socket, data: bytes) -> None:
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(5)
        while s.recv(65536):  # answers, if any, then the server closes on us
            pass
    except OSError:  # the server hung up first: that is its right
        pass


def test_the_store_refuses_every_input_before_the_handshake(side_job) -> None:
    """Requests, handshake halves and hellos, sent raw instead of a proof."""
    inputs = _seeds("store_server") + [d[1:] for d in _seeds("handshake")]
    for data in inputs:
        with socket.create_connection(("127.0.0.1", side_job["server"].port), timeout=5) as s:
            _send_and_drain(s, data)
        COUNTS["store-before-handshake"] += 1
    _store_still_serves(side_job)


def test_the_store_refuses_another_jobs_key(side_job) -> None:
    with socket.create_connection(("127.0.0.1", side_job["server"].port), timeout=5) as s:
        with pytest.raises(AuthenticationError):
            _auth.connect_handshake(s, b"another job's key", b"store", timeout=5)
    _store_still_serves(side_job)


def test_the_store_survives_every_input_from_an_authenticated_client(side_job) -> None:
    """The store_server target's corpus over real connections that proved the key. The
    keys its requests wait for are set first, so that no wait lasts its timeout."""
    client = side_job["client"]
    for data in _seeds("store_server"):
        for key, value in (("k", b"v"), ("n", b"1"), ("big", b"b")):
            client.set(key, value)
        with socket.create_connection(("127.0.0.1", side_job["server"].port), timeout=5) as s:
            _auth.connect_handshake(s, SECRET, b"store", timeout=5)
            _send_and_drain(s, data)
        COUNTS["store-frames"] += 1
    _store_still_serves(side_job)


def test_a_formed_mesh_accepts_no_connections(side_job) -> None:
    """The transport's listener closes once the mesh is built, so after rendezvous only the
    store can be reached from outside, and it is fuzzed above."""
    host, _, port = side_job["client"].get("pycollective/1/tcp/1").decode().rpartition(":")
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2).close()


def test_zz_the_job_beside_kept_working_and_memory_stayed_bounded(side_job) -> None:
    """Runs last in this module: every input ran; the job gave only correct results."""
    side_job["client"].set("side/stop", b"1")
    outs = []
    for p in side_job["procs"]:
        stdout, stderr = p.communicate(timeout=60)
        assert p.returncode == 0, stderr[-3000:]
        line = next(x for x in stdout.splitlines() if x.startswith("SIDE "))
        outs.append(json.loads(line[5:]))
    for o in outs:
        assert o["bad"] == 0 and o["iterations"] > 0 and o["counted"] == o["store_ops"], o
    grew = _rss() - side_job["rss0"]
    assert grew < RSS_GROWTH_LIMIT, f"the process grew by {grew} bytes"
    total = sum(COUNTS.values())
    report = os.environ.get("PYCOLLECTIVE_FUZZ_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump(
                {
                    "inputs": total,
                    "per_target": dict(COUNTS),
                    "side_job": outs,
                    "rss_growth_bytes": grew,
                },
                f,
            )
    assert COUNTS["store-before-handshake"] >= 20 and COUNTS["store-frames"] >= 10, COUNTS
