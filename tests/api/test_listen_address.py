"""Which address a rank advertises: the interface that routes to where the job meets
(MASTER_ADDR, a tcp:// init address, the host of torch's store), PYCOLLECTIVE_SOCKET_IFNAME
when set, loopback for a job on one host; and a job that spans hosts with no routable
meeting place (none known, or a loopback one) is refused at once on every rank, naming the
fix, instead of advertising 127.0.0.1 to the other hosts.

Multi-host jobs over tcp:// with no MASTER_ADDR (as Ray Train's init_method="tcp" starts
them) run for real in tests/multihost/test_multihost.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from pycollective import _launch_env, _netutil
from pycollective._errors import UsageError
from pycollective._netutil import free_port
from pycollective.core import rendezvous

pytestmark = pytest.mark.timeout(60)


def test_one_host_listens_on_loopback(monkeypatch):
    monkeypatch.delenv("PYCOLLECTIVE_SOCKET_IFNAME", raising=False)
    assert _netutil.listen_address(None, False) == ("127.0.0.1", "127.0.0.1")
    assert _netutil.listen_address("localhost", False) == ("127.0.0.1", "127.0.0.1")


@pytest.mark.parametrize("meeting", [None, "127.0.0.1", "localhost"])
def test_several_hosts_without_a_routable_meeting_place_are_refused(monkeypatch, meeting):
    monkeypatch.delenv("PYCOLLECTIVE_SOCKET_IFNAME", raising=False)
    with pytest.raises(UsageError) as err:
        _netutil.listen_address(meeting, True)
    text = str(err.value)
    assert "spans hosts" in text and "PYCOLLECTIVE_SOCKET_IFNAME" in text
    assert "MASTER_ADDR" in text and "tcp://" in text
    assert ("not known" in text) == (meeting is None)


def test_the_interface_named_wins(monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_SOCKET_IFNAME", "lo")
    assert _netutil.listen_address(None, True) == ("127.0.0.1", "127.0.0.1")
    monkeypatch.setenv("PYCOLLECTIVE_SOCKET_IFNAME", "no-such-if0")
    with pytest.raises(UsageError, match="no-such-if0"):
        _netutil.listen_address("10.1.2.3", True)


def test_the_meeting_place_of_a_tcp_init_method_is_its_host():
    env = _launch_env.detect({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"})
    assert env.master_addr is None and env.multi_node  # Ray Train's tcp mode
    assert rendezvous.meeting_host("tcp://10.77.0.1:29500", env) == "10.77.0.1"
    assert rendezvous.meeting_host("tcp://[fe80::1]:29500", env) == "fe80::1"
    assert rendezvous.meeting_host(None, env) is None
    with_master = _launch_env.detect({"MASTER_ADDR": "node0", "RANK": "0", "WORLD_SIZE": "1"})
    assert rendezvous.meeting_host("env://", with_master) == "node0"


RANK_PROGRAM = textwrap.dedent(
    """
    import sys, time
    which, url, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if which == "torch":
        import datetime, torch.distributed as dist
    else:
        import pycollective as dist
    t0 = time.monotonic()  # after the imports: torch's alone takes 10 s at load 15
    try:
        if which == "torch":
            dist.init_process_group("pycollective", init_method=url, rank=rank, world_size=2,
                                    timeout=datetime.timedelta(seconds=40))
        else:
            dist.init_process_group(init_method=url, rank=rank, world_size=2, timeout=40)
    except Exception as exc:
        print(f"RAISED after {time.monotonic() - t0:.1f} s: {type(exc).__name__}: {exc}")
        sys.exit(3)
    print("JOINED")
    """
)


@pytest.mark.timeout(100)
@pytest.mark.parametrize("which", ["torch", "pycollective"])
def test_a_job_said_to_span_hosts_meeting_at_loopback_fails_at_once_on_every_rank(which):
    """RANK, WORLD_SIZE and LOCAL_WORLD_SIZE=1 (one rank a host: several hosts) with
    tcp://127.0.0.1: before, each rank advertised 127.0.0.1 to the others."""
    url = f"tcp://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "PYCOLLECTIVE_S"))}
    procs = []
    for rank in (0, 1):
        env_r = dict(env, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK_PROGRAM, which, url, str(rank)],
                env=env_r,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    # the wall clock bounds only a hang here (two interpreters importing torch on a loaded
    # machine); "at once" is each rank's own time in init_process_group
    outs = [p.communicate(timeout=80) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 3, (out, err)
        assert "spans hosts" in out and "PYCOLLECTIVE_SOCKET_IFNAME" in out, (out, err)
        elapsed = float(re.search(r"RAISED after ([0-9.]+) s", out)[1])
        assert elapsed < 30, f"a rank took {elapsed:.1f} s to refuse (its timeout is 40 s)"
