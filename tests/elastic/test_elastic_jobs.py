"""pycollective.elastic with real processes: kill -9 of members at random moments (mid-step,
mid-collective, mid-recovery, while joining, two at once), the loss of the member that
started the store, and a partition without a majority. The quick default kills 7 times in
one job; `make faults` (tools/faults.py --only elastic) kills 20 times and reports the
distribution of recovery times. Set EL_KILLS=20 to run the full count here."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from tests import _etcd
from tests.elastic._harness import Job, kills_in_a_row

from pycollective.store import TCPStore

KILLS = int(os.environ.get("EL_KILLS", "7"))


@pytest.mark.timeout(120 + 20 * KILLS)
def test_kill_9_in_a_row_the_survivors_finish_identical_with_their_replacements():
    out = kills_in_a_row(KILLS, seed=20261201)
    assert out.problems == [], (out.problems, out.stderr[-4000:])
    kinds = {k.kind for k in out.kills}
    assert {"step", "collective", "double", "recovery"} <= kinds
    for k in out.kills:
        # at most the step in flight is lost, and training resumes within the bound
        assert k.resumed_step >= k.committed_before - 1, k
        assert k.recovery_s is not None and k.recovery_s < 10, k
    assert len(out.replacement_seconds()) >= 3


@pytest.mark.timeout(300)
def test_kill_9_in_a_row_with_the_store_on_etcd():
    # the same job, its store a 3-member etcd on loopback (PYCOLLECTIVE_STORE): liveness
    # from etcd leases, waits by watches, kills noticed through closed connections
    if _etcd.missing():
        pytest.fail(_etcd.missing())
    with _etcd.EtcdCluster(3) as etcd:
        url = f"etcd://{etcd.endpoints}/{uuid.uuid4().hex[:8]}"
        out = kills_in_a_row(5, seed=20261202, env={"PYCOLLECTIVE_STORE": url})
    assert out.problems == [], (out.problems, out.stderr[-4000:])
    for k in out.kills:
        assert k.resumed_step >= k.committed_before - 1, k
        assert k.recovery_s is not None and k.recovery_s < 10, k
    assert len(out.replacement_seconds()) >= 3


def _one_storehost(port: int) -> list[int]:
    """The store hosts of `port` once any that lost the race to bind it have left."""
    deadline = time.monotonic() + 20
    while len(found := _storehosts(port)) > 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def _storehosts(port: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
            except OSError:
                continue
            if b"pycollective.elastic._storehost" in cmd and str(port).encode() in cmd:
                found.append(int(entry))
    return found


@pytest.mark.timeout(180)
def test_the_member_that_started_the_store_is_lost_and_the_job_goes_on():
    # started by hand: no launcher hosts the store, the first member starts a store
    # process of its own; losing that member loses nothing, a replacement joins by hand
    job = Job(3, launcher=False, env={"EL_STEPS": "1000000", "EL_STORE_IDLE": "2"})
    try:
        assert job.wait(lambda j: j.stepping(3), 90), job.stderr
        store = TCPStore("127.0.0.1", job.port, None, timeout=5)
        spawner = int(store.get("elastic/job/store-started-by"))
        store.close()
        assert len(_one_storehost(job.port)) == 1
        victim = next(m.id for m in job.members.values() if m.pid == spawner)
        kill = job.kill([victim], "step")
        assert job.wait(lambda j: j.stepping(2), 60), job.stderr
        job.start_member(3)  # the replacement, by hand
        assert job.wait(lambda j: j.stepping(3), 90), job.stderr
        stop = job.max_step() + 30
        job.stop_at(stop)
        job.finish(60)
        rc = 0 if all(p.returncode == 0 for p in job.procs if p.pid != spawner) else 1
    finally:
        job.finish(5)
    out = job.judge(rc, [kill], stop)
    assert out.problems == [], (out.problems, out.stderr[-3000:])
    assert kill.recovery_s < 10
    # the store host leaves once its last client left (EL_STORE_IDLE)
    deadline = time.monotonic() + 15
    while _storehosts(job.port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _storehosts(job.port) == []
    assert job.leftovers() == []


@pytest.mark.timeout(120)
def test_a_partition_without_a_majority_raises_on_every_member():
    # two of four stop answering (SIGSTOP: alive, leases held, silent); the other two
    # time out, cannot form a majority and raise; the two, resumed, raise as well
    job = Job(4, elastic="2:4", env={"EL_STEPS": "1000000", "EL_TIMEOUT": "2", "EL_JOIN": "1.5"})
    try:
        assert job.wait(lambda j: j.stepping(4), 90), job.stderr
        stopped = [job.members[2].pid, job.members[3].pid]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        raised = lambda j, r: any(f"[rank {r}]: " in ln and "ElasticError" in ln for ln in j.stderr)  # noqa: E731
        assert job.wait(lambda j: raised(j, 0) and raised(j, 1), 30), "".join(job.stderr)
        elapsed = time.monotonic() - t0
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        assert job.wait(lambda j: raised(j, 2) and raised(j, 3), 30), "".join(job.stderr)
        rc = job.finish(30)
    finally:
        for m in job.members.values():
            try:
                os.kill(m.pid, signal.SIGCONT)
            except OSError:
                pass
        job.finish(5)
    err = "".join(job.stderr)
    assert rc not in (0, None)
    assert "no majority: 2 of the 4 live members" in err
    for r in range(4):
        lines = [ln for ln in job.stderr if ln.startswith(f"[rank {r}]: ") and "ElasticError" in ln]
        assert any("majority" in ln for ln in lines), (r, lines)
    assert elapsed < 2 + 1.5 + 10  # the collective timeout, the join timeout, slack
    assert job.leftovers() == []


@pytest.mark.timeout(120)
def test_when_the_store_dies_training_goes_on_until_the_next_membership_change():
    job = Job(3, launcher=False, env={"EL_STEPS": "1000000", "EL_TIMEOUT": "10"})
    try:
        assert job.wait(lambda j: j.stepping(3), 90), job.stderr
        hosts = _one_storehost(job.port)
        assert len(hosts) == 1
        os.kill(hosts[0], signal.SIGKILL)
        before = job.max_step()
        assert job.wait(lambda j: j.max_step() > before + 20, 30)  # no failure: no store needed
        victim = max(m.id for m in job.live())
        t0 = time.monotonic()
        job.kill([victim], "step")
        dead = job.members[victim].pid

        def gone(j: Job) -> bool:
            return all(p.poll() is not None for p in j.procs if p.pid != dead)

        assert job.wait(gone, 30), "".join(job.stderr)
        elapsed = time.monotonic() - t0
    finally:
        job.finish(5)
    err = "".join(job.stderr)
    for m in job.members.values():
        if m.id != victim:
            lines = [ln for ln in job.stderr if ln.startswith(f"[member {m.id}]: ")]
            assert any("StoreError" in ln for ln in lines), (m.id, lines[-5:])
    assert "the store is unreachable" in err  # said once, when the leader first missed it
    assert elapsed < 15
    assert job.leftovers() == []


@pytest.mark.timeout(120)
def test_a_silent_member_is_left_out_by_the_majority_and_adopts_the_state_when_back():
    # one of four stops answering (SIGSTOP): the three time out, wait the join timeout,
    # go on as a majority; resumed, it rejoins and takes their state, whatever it held
    job = Job(4, elastic="2:4", env={"EL_STEPS": "1000000", "EL_TIMEOUT": "2", "EL_JOIN": "1.5"})
    try:
        assert job.wait(lambda j: j.stepping(4), 90), job.stderr
        silent = job.members[3]
        os.kill(silent.pid, signal.SIGSTOP)
        t0 = time.time()
        others = [m for m in job.members.values() if m.id != 3]

        def went_on(j: Job) -> bool:
            return all(any(s["ok"] and s["size"] == 3 and s["t"] > t0 for s in m.steps)
                       for m in others)  # fmt: skip

        assert job.wait(went_on, 30), "".join(job.stderr)
        os.kill(silent.pid, signal.SIGCONT)
        assert job.wait(lambda j: j.stepping(4), 60), "".join(job.stderr)
        stop = job.max_step() + 30
        job.stop_at(stop)
        rc = job.finish(60)
    finally:
        for m in job.members.values():
            try:
                os.kill(m.pid, signal.SIGCONT)
            except OSError:
                pass
        job.finish(5)
    assert rc == 0, "".join(job.stderr)[-3000:]
    assert len({m.done["digest"] for m in job.members.values() if m.done}) == 1
    assert all(m.done and m.done["step"] == stop for m in job.members.values())
    back = job.members[3].rounds[-1]
    assert back["received_state"], back
    assert job.leftovers() == []
