"""EtcdStore against real etcd members on loopback (tests/_etcd.py): what the store
battery (test_store_ops.py) cannot show. Signed values (forged, unsigned, moved, another
secret: an error naming the key), the job's keys vanishing with its last client, liveness
leases ending with their process, waits that watch rather than poll, several endpoints in
turn when a member dies, a clear error when the quorum is lost, etcd's own auth."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import uuid

import pytest
from tests._etcd import EtcdCluster, make_certs

from pycollective import _errors, _keys
from pycollective.store import EtcdStore, StoreError, _signed
from pycollective.store import _etcd_client as client
from pycollective.store.etcd import parse_url

SECRET = b"test-secret"
pytestmark = pytest.mark.timeout(60)


def _job() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def _raw(cluster: EtcdCluster, path: str, body: dict, i: int = 0) -> dict:
    req = urllib.request.Request(f"http://{cluster.endpoint(i)}/v3/{path}",
                                 json.dumps(body).encode(), method="POST")  # fmt: skip
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def test_urls_and_endpoints_parse_or_say_what_is_expected():
    assert parse_url("etcd://h1:2379,h2:2380/job") == ("h1:2379,h2:2380", "job")
    assert parse_url("etcd://h1") == ("h1", "default")
    assert parse_url("etcds://h1:1/j") == ("https://h1:1", "j")
    eps = client.parse_endpoints("h1,h2:2380,[::1]:3,https://h4:4")
    assert [(e.scheme, e.host, e.port) for e in eps] == [
        ("http", "h1", 2379),
        ("http", "h2", 2380),
        ("http", "::1", 3),
        ("https", "h4", 4),
    ]
    for bad in ("", "h1:port", "ftp://h1:1"):
        with pytest.raises(_errors.UsageError, match="etcd|endpoint"):
            client.parse_endpoints(bad)
    with pytest.raises(_errors.UsageError, match="etcd://"):
        parse_url("tcp://h1:1")


def test_forged_unsigned_moved_and_foreign_values_are_errors_naming_the_key(etcd):
    job = _job()
    store = EtcdStore(etcd.endpoints, job, SECRET, timeout=5)
    try:
        # a job with another secret cannot even join this one
        with pytest.raises(StoreError, match="incarnation' fails its signature"):
            EtcdStore(etcd.endpoints, job, b"another-secret", timeout=5)
        store.set("good", "v")
        assert store.get("good") == b"v"
        # unsigned: what anyone who reaches etcd could write
        _raw(etcd, "kv/put", {"key": _b64(store.full_key("addr").encode()), "value": _b64(b"x")})
        with pytest.raises(StoreError, match="'addr' is not signed"):
            store.get("addr")
        with pytest.raises(StoreError, match="'addr'"):
            store.check(["addr"])
        with pytest.raises(StoreError, match="'addr'"):
            store.add("addr", 1)
        # a signed value copied to another key
        good = _raw(etcd, "kv/range", {"key": _b64(store.full_key("good").encode())})["kvs"][0]
        _raw(etcd, "kv/put", {"key": _b64(store.full_key("copy").encode()), "value": good["value"],
                              "lease": good["lease"]})  # fmt: skip
        with pytest.raises(StoreError, match="'copy' fails its signature"):
            store.get("copy")
        # signed with another secret, on this job's lease
        name = store.full_key("theirs").encode()
        key = _signed.derive_key(_keys.as_key(b"another"))
        theirs = _signed.seal(key, name, b"v", int(good["lease"]))
        _raw(etcd, "kv/put", {"key": _b64(name), "value": _b64(theirs), "lease": good["lease"]})
        with pytest.raises(StoreError, match="'theirs' fails its signature"):
            store.get("theirs")
        # a forgery that arrives while we wait for the key
        forged = {"key": _b64(store.full_key("late").encode()), "value": _b64(b"pcs1" + bytes(60))}
        threading.Timer(0.2, _raw, (etcd, "kv/put", forged)).start()
        with pytest.raises(StoreError, match="'late'"):
            store.get("late", timeout=5)
    finally:
        store.close()


def test_the_jobs_keys_vanish_with_its_last_client_and_a_rerun_starts_clean(etcd):
    job = _job()
    a = EtcdStore(etcd.endpoints, job, SECRET, timeout=5)
    b = EtcdStore(etcd.endpoints, job, SECRET, timeout=5)
    a.set("done", "1")
    a.close()
    assert b.get("done") == b"1"  # a client is still there: kept
    b.close()
    c = EtcdStore(etcd.endpoints, job, SECRET, timeout=5)
    try:
        assert not c.check(["done"])  # the last one out revoked the job's lease
        assert c.num_keys() == 0
    finally:
        c.close()


_LEASER = """
    import sys, time
    from pycollective.store import EtcdStore
    s = EtcdStore(sys.argv[1], sys.argv[2], b"test-secret", timeout=10)
    s.set_lease("alive/me", "1")
    s.set("kept", "1")
    print("ready", flush=True)
    time.sleep(60)
"""


def test_a_liveness_lease_ends_with_its_process_within_the_ttl(etcd):
    job = _job()
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_LEASER), etcd.endpoints, job],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    watcher = EtcdStore(etcd.endpoints, job, SECRET, timeout=10)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert watcher.check(["alive/me", "kept"])
        rev = watcher.revision
        proc.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        gone = None
        for kind, key, _, _ in watcher.watch_prefix("alive/", rev, time.monotonic() + 10):
            if kind == "DELETE" and key == "alive/me":
                gone = time.monotonic() - t0
                break
        assert gone is not None and gone < 2 + 1.5, gone  # TTL 2 s, lessor checks every 0.5 s
        assert watcher.check(["kept"])  # the job's own keys stay while a client remains
    finally:
        proc.kill()
        proc.wait()
        watcher.close()


def test_waits_watch_instead_of_polling(etcd, monkeypatch):
    store = EtcdStore(etcd.endpoints, _job(), SECRET, timeout=5)
    posts = []
    real = client.EtcdClient._post

    def counted(self, ep, path, data, timeout):
        posts.append(path)
        return real(self, ep, path, data, timeout)

    monkeypatch.setattr(client.EtcdClient, "_post", counted)
    try:
        threading.Timer(1.0, EtcdStore.set, (store, "late", "here")).start()
        assert store.get("late", timeout=5) == b"here"
        with pytest.raises(StoreError, match="timed out"):
            store.wait(["never"], timeout=1.0)
    finally:
        store.close()
    # a range, a watch (its own connection, not counted), then the put; for the wait:
    # a range and a last one at the deadline; and the keepalives of the job's lease
    asked = [p for p in posts if not p.startswith("lease/")]
    assert len(asked) <= 6, asked


@pytest.fixture(scope="module")
def three():
    with EtcdCluster(3) as cluster:
        yield cluster


def test_several_endpoints_are_tried_in_turn_when_a_member_dies(three):
    job = _job()
    store = EtcdStore(three.endpoints, job, SECRET, timeout=10)
    try:
        store.set("a", "1")
        first = three.endpoints.split(",")[0]
        assert str(store.endpoints[0]) == first
        three.kill(0)
        t0 = time.monotonic()
        assert store.add("n", 1) == 1
        assert store.get("a") == b"1"
        assert time.monotonic() - t0 < 5
    finally:
        store.close()
        three.restart(0)
        three.wait_healthy(30)


def test_the_loss_of_the_quorum_is_named_within_a_bound(three):
    store = EtcdStore(three.endpoints, _job(), SECRET, timeout=10)
    try:
        store.set("a", "1")
        three.kill(1)
        three.kill(2)
        t0 = time.monotonic()
        with pytest.raises(StoreError, match="lost its quorum"):
            store.set("b", "2")
        assert time.monotonic() - t0 < 20
    finally:
        three.restart(1)
        three.restart(2)
        three.wait_healthy(30)
        store.close()


def test_etcd_auth_is_passed_through(tmp_path):
    with EtcdCluster(1) as cluster:
        _raw(cluster, "auth/user/add", {"name": "root", "password": "pw"})
        _raw(cluster, "auth/user/grant", {"user": "root", "role": "root"})
        _raw(cluster, "auth/enable", {})
        pw = tmp_path / "pw"
        pw.write_text("pw\n")
        pw.chmod(0o600)  # a secret: the store reads it only if it is private
        with pytest.raises(StoreError, match="user name is empty|permission denied|auth"):
            EtcdStore(cluster.endpoints, _job(), SECRET, timeout=3)
        env = dict(os.environ, PYCOLLECTIVE_ETCD_USER="root",
                   PYCOLLECTIVE_ETCD_PASSWORD_FILE=str(pw))  # fmt: skip
        code = textwrap.dedent("""
            import sys
            from pycollective.store import EtcdStore
            s = EtcdStore(sys.argv[1], "authjob", b"k", timeout=5)
            s.set("x", "1"); print(s.get("x").decode()); s.close()
        """)
        out = subprocess.run([sys.executable, "-c", code, cluster.endpoints], env=env,
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr[-2000:]


def test_etcd_tls_with_client_certificates_is_passed_through(tmp_path):
    certs = make_certs(str(tmp_path))
    with EtcdCluster(1, tls=certs) as cluster:
        code = textwrap.dedent("""
            import sys
            from pycollective.store import EtcdStore
            s = EtcdStore(sys.argv[1], "tlsjob", b"k", timeout=5)
            s.set("x", "1"); print(s.get("x").decode()); s.close()
        """)
        env = dict(os.environ, PYCOLLECTIVE_ETCD_CACERT=certs["ca"],
                   PYCOLLECTIVE_ETCD_CERT=certs["cert"],
                   PYCOLLECTIVE_ETCD_KEY=certs["key"])  # fmt: skip
        out = subprocess.run([sys.executable, "-c", code, cluster.endpoints], env=env,
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr[-2000:]
        # without its certificate the member refuses us, and the error says so
        env.pop("PYCOLLECTIVE_ETCD_CERT")
        env.pop("PYCOLLECTIVE_ETCD_KEY")
        out = subprocess.run([sys.executable, "-c", code, cluster.endpoints], env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert out.returncode != 0
        assert "StoreError" in out.stderr and "could not reach etcd" in out.stderr, out.stderr
