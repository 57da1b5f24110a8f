"""Real etcd clusters for the tests and tools/faults.py, started and torn down here: one
or more `etcd` members (Debian's etcd-server, `make system-deps` installs it), each with
its data in a temporary directory, on loopback ports, or each in the network namespace of
a tools/nethosts.py host, on that host's address.

    with EtcdCluster(3) as etcd:                     # loopback, free ports
        store = EtcdStore(etcd.endpoints, "job")
    with EtcdCluster(3, hosts=hosts, on=[0, 1, 2]):  # members in namespace hosts 0..2
        ...

The members use etcd's defaults (heartbeat 100 ms, election timeout 1 s), which is what
the recovery times measured with them assume.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from pycollective._netutil import free_port

ETCD = shutil.which("etcd")
CLIENT_PORT = 2379
PEER_PORT = 2380


def make_certs(directory: str) -> dict[str, str]:
    """A CA and one certificate it signed for 127.0.0.1 (server and client alike), with
    openssl: what a site that runs etcd with TLS and client certificates has."""
    d = lambda name: os.path.join(directory, name)  # noqa: E731
    run = lambda *argv: subprocess.run(argv, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
        "/CN=pycollective test CA", "-keyout", d("ca.key"), "-out", d("ca.pem"))  # fmt: skip
    with open(d("ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", d("node.key"), "-out", d("node.csr"))  # fmt: skip
    run("openssl", "x509", "-req", "-in", d("node.csr"), "-CA", d("ca.pem"), "-CAkey",
        d("ca.key"), "-CAcreateserial", "-days", "2", "-extfile", d("ext.cnf"),
        "-out", d("node.pem"))  # fmt: skip
    return {"ca": d("ca.pem"), "cert": d("node.pem"), "key": d("node.key")}


def missing() -> str | None:
    """None when etcd can be started here, else why not."""
    if ETCD is None:
        return "etcd is not installed (make system-deps installs Debian's etcd-server)"
    return None


_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _in_netns(name: str, fn: Callable[[], dict], timeout: float) -> dict:
    """fn() in a thread that first joins the network namespace `name` (setns(2) moves only
    the calling thread; the thread ends with the call). The tests poll etcd's status many
    times a run: an interpreter started in the namespace per request (`ip netns exec`)
    took over a second each at load 12, more than half of a job's minute."""
    got: list[dict] = [{}]

    def run() -> None:
        fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc.setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into {name}: {os.strerror(err)}")
        finally:
            os.close(fd)
        got[0] = fn()

    failed: list[BaseException] = []

    def guarded() -> None:
        try:
            run()
        except BaseException as exc:  # re-raised in the caller
            failed.append(exc)

    thread = threading.Thread(target=guarded, name=f"netns {name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if failed:
        raise failed[0]
    return got[0]


class EtcdCluster:
    """`n` etcd members; member i on `hosts` host `on[i]` (namespace hosts) or loopback."""

    def __init__(
        self,
        n: int = 1,
        *,
        hosts: Any = None,
        on: Sequence[int] | None = None,
        token: str | None = None,
        extra: Sequence[str] = (),
        tls: dict[str, str] | None = None,
    ) -> None:
        if ETCD is None:
            raise RuntimeError(missing())
        self.n = n
        self.hosts = hosts
        self.on = list(on if on is not None else range(n))
        self.tmp = tempfile.mkdtemp(prefix="pycollective-etcd-")
        self.token = token or f"pc-{os.getpid()}-{int(time.time() * 1e3)}"
        self.extra = list(extra)
        # {"cert", "key", "ca"}: clients must speak TLS and show a certificate the CA signed
        self.tls = tls
        self.scheme = "https" if tls else "http"
        if tls:
            self.extra += ["--cert-file", tls["cert"], "--key-file", tls["key"],
                           "--trusted-ca-file", tls["ca"], "--client-cert-auth"]  # fmt: skip
        if hosts is None:
            self.addrs = ["127.0.0.1"] * n
            self.client_ports = [free_port() for _ in range(n)]
            self.peer_ports = [free_port() for _ in range(n)]
        else:
            self.addrs = [hosts.addrs[k] for k in self.on]
            self.client_ports = [CLIENT_PORT] * n
            self.peer_ports = [PEER_PORT] * n
        self.procs: list[subprocess.Popen | None] = [None] * n
        self.logs: list[str] = [os.path.join(self.tmp, f"m{i}.log") for i in range(n)]

    # ------------------------------------------------------------------ lifecycle

    @property
    def endpoints(self) -> str:
        return ",".join(f"{a}:{p}" for a, p in zip(self.addrs, self.client_ports, strict=True))

    def endpoint(self, i: int) -> str:
        return f"{self.addrs[i]}:{self.client_ports[i]}"

    def _initial_cluster(self) -> str:
        return ",".join(f"m{i}=http://{self.addrs[i]}:{self.peer_ports[i]}" for i in range(self.n))

    def _argv(self, i: int, state: str) -> list[str]:
        a, cp, pp = self.addrs[i], self.client_ports[i], self.peer_ports[i]
        return [ETCD, "--name", f"m{i}", "--data-dir", os.path.join(self.tmp, f"m{i}.data"),
                "--listen-client-urls", f"{self.scheme}://{a}:{cp}",
                "--advertise-client-urls", f"{self.scheme}://{a}:{cp}",
                "--listen-peer-urls", f"http://{a}:{pp}",
                "--initial-advertise-peer-urls", f"http://{a}:{pp}",
                "--initial-cluster", self._initial_cluster(),
                "--initial-cluster-token", self.token,
                "--initial-cluster-state", state, *self.extra]  # fmt: skip

    def start_member(self, i: int, state: str = "new") -> None:
        log = open(self.logs[i], "ab")  # noqa: SIM115 - the child keeps it
        argv = self._argv(i, state)
        try:
            if self.hosts is None:
                proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
            else:
                proc = self.hosts.popen(self.on[i], argv, stdout=log, stderr=log,
                                        start_new_session=True)  # fmt: skip
        finally:
            log.close()
        self.procs[i] = proc

    def start(self, timeout: float = 60) -> EtcdCluster:
        for i in range(self.n):
            self.start_member(i)
        self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 60, members: Sequence[int] | None = None) -> None:
        """Until every member in `members` (default all running) reports a leader."""
        deadline = time.monotonic() + timeout
        wanted = [i for i in (members if members is not None else range(self.n))
                  if self.procs[i] is not None]  # fmt: skip
        while time.monotonic() < deadline:
            if all(self.status(i).get("leader") for i in wanted):
                return
            for i in wanted:
                p = self.procs[i]
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"etcd member {i} exited {p.returncode}: {self.log(i)}")
            time.sleep(0.1)
        raise RuntimeError(f"etcd cluster not healthy in {timeout} s: "
                           + " | ".join(self.log(i)[-600:] for i in wanted))  # fmt: skip

    def log(self, i: int) -> str:
        try:
            with open(self.logs[i], errors="replace") as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def __enter__(self) -> EtcdCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def kill(self, i: int) -> None:
        p = self.procs[i]
        if p is not None and p.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
            p.kill()
            p.wait()
        self.procs[i] = None

    def restart(self, i: int) -> None:
        """Member i again, from its data directory (a host that rebooted)."""
        self.kill(i)
        self.start_member(i, "existing")

    def running(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None]

    def close(self) -> None:
        for i in range(self.n):
            self.kill(i)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ status

    def _post(self, i: int, path: str, body: dict, timeout: float = 1.0) -> dict:
        """A request to member i's gateway, from where the test runs (loopback), or from
        inside its host (namespaces: the test process is outside them; a thread of its
        own enters the host's network namespace for the request, see _in_netns)."""
        url = f"{self.scheme}://{self.endpoint(i)}/v3/{path}"
        req = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
        ctx = None
        if self.tls:
            ctx = ssl.create_default_context(cafile=self.tls["ca"])
            ctx.load_cert_chain(self.tls["cert"], self.tls["key"])

        def post() -> dict:
            try:
                with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
                    return json.loads(resp.read())
            except (OSError, ValueError, urllib.error.URLError):
                return {}

        if self.hosts is None:
            return post()
        return _in_netns(self.hosts.names[self.on[i]], post, timeout + 5)

    def status(self, i: int) -> dict:
        if self.procs[i] is None:
            return {}
        return self._post(i, "maintenance/status", {})

    def leader(self) -> int | None:
        """The index of the member that leads now (None: no leader, or none answers)."""
        status = {i: self.status(i) for i in self.running()}
        ids = {st.get("header", {}).get("member_id"): i for i, st in status.items()}
        for st in status.values():
            if st.get("leader") in ids:
                return ids[st["leader"]]
        return None
