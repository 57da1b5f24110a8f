"""A Ray cluster across two network-namespace hosts (tools/nethosts.py): `ray start --head`
on host 0 and `ray start --address` on host 1, each bound to its namespace address, with a
custom resource naming the host ("host0", "host1") so the job can place actors, and Ray's
token authentication on (one token for both nodes and the driver, as a real cluster needs).
Used by tests/ray/test_multihost_ray.py and benchmarks/ray_bench.py.

    with RayHosts() as cluster:
        cluster.driver([python, script, ...])   # runs on host 0, connected to the cluster
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools import nethosts  # noqa: E402

PORT = 6379
OBJECT_STORE = str(300 << 20)  # bytes per node: the jobs move a few MiB


class RayHosts:
    def __init__(self, cpus_per_host: int = 2) -> None:
        self.cpus = cpus_per_host
        self.hosts = nethosts.NetHosts(2)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        self.env.update(
            RAY_USAGE_STATS_ENABLED="0",
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=secrets.token_hex(32),
            PYTHONUNBUFFERED="1",
        )
        for k in ("PYCOLLECTIVE_SECRET", "PYCOLLECTIVE_SOCKET_IFNAME", "MASTER_ADDR"):
            self.env.pop(k, None)
        self._dirs: list[str] = []
        self.ray = str(Path(sys.executable).parent / "ray")

    @property
    def address(self) -> str:
        return f"{self.hosts.addrs[0]}:{PORT}"

    def __enter__(self) -> RayHosts:
        nethosts.cleanup()
        self.hosts.up()
        try:
            for k in range(2):
                temp = tempfile.mkdtemp(prefix=f"pcr{k}-", dir="/tmp")
                self._dirs.append(temp)
                where = ["--head", "--port", str(PORT), "--include-dashboard", "false"] if k == 0 \
                    else ["--address", self.address]  # fmt: skip
                self._ray(k, "start", *where, "--node-ip-address", self.hosts.addrs[k],
                          "--num-cpus", str(self.cpus), "--resources", f'{{"host{k}": 16}}',
                          "--object-store-memory", OBJECT_STORE, "--disable-usage-stats",
                          "--temp-dir", temp)  # fmt: skip
        except BaseException:
            self.__exit__()
            raise
        return self

    def _ray(self, k: int, *args: str, timeout: float = 180) -> None:
        with tempfile.TemporaryFile("w+") as log:  # no pipe: Ray's daemons would hold it
            res = subprocess.run(self.hosts.command(k, [self.ray, *args]), env=self.env,
                                 stdout=log, stderr=subprocess.STDOUT, timeout=timeout)  # fmt: skip
            if res.returncode != 0:
                log.seek(0)
                raise RuntimeError(f"ray {' '.join(args)} on host {k}:\n{log.read()[-4000:]}")

    def driver(self, argv: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
        """Run a driver on host 0 (RAY_ADDRESS set), capturing its output."""
        env = dict(self.env, RAY_ADDRESS=self.address)
        return self.hosts.run(0, argv, timeout=timeout, env=env, cwd=REPO)

    def __exit__(self, *exc: object) -> None:
        # Not `ray stop`: it kills every Ray process of the machine by name (another
        # cluster's too). The namespaces' teardown kills exactly the processes in them.
        try:
            self.hosts.close()
        finally:
            for d in self._dirs:
                subprocess.run(["rm", "-rf", d], check=False)
