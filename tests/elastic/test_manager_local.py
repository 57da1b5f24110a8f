"""The Manager in one process: a job of one member, and its argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from pycollective import UsageError, elastic
from pycollective.store import HashStore, TCPStore, TCPStoreServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store():
    server = TCPStoreServer("127.0.0.1", 0).start()
    client = TCPStore("127.0.0.1", server.port, None, timeout=10)
    yield client
    client.close()
    server.close()


def test_a_job_of_one_member_commits_every_step(store, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "PYCOLLECTIVE_ELASTIC", "PYCOLLECTIVE_SECRET"):
        monkeypatch.delenv(k, raising=False)
    w = np.zeros(3)
    mgr = elastic.Manager(lambda: {"w": w.copy()}, lambda s: w.__setitem__(slice(None), s["w"]),
                          store=store, job="one", join_timeout=1)  # fmt: skip
    sampler = elastic.ElasticSampler(mgr, 10, 4, seed=0)
    seen = []
    for _ in mgr.steps(5):
        seen.append(sampler.indices().tolist())
        g = np.ones(3)
        assert mgr.average([g])
        assert (g == 1).all()  # the mean over one member's whole batch
        assert mgr.should_commit()
        w -= 0.1 * g
    assert mgr.step == 5 and mgr.samples == 20 and mgr.size == 1 and mgr.rank == 0
    assert sorted(sum(seen, [])[:10]) == list(range(10))  # epoch 0: each sample once
    assert [e.round for e in mgr.events] == [0]
    mgr.close()
    mgr.close()  # idempotent
    with pytest.raises(UsageError, match="closed"):
        mgr.start_step()


def test_argument_checks(store, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(UsageError, match="needs its store"):
        elastic.Manager()
    with pytest.raises(UsageError, match="TCPStore"):
        elastic.Manager(store=HashStore())
    with pytest.raises(UsageError, match="min_size"):
        elastic.Manager(store=store, min_size=3, max_size=2)
    monkeypatch.setenv("PYCOLLECTIVE_ELASTIC", "4:2")
    with pytest.raises(UsageError, match="PYCOLLECTIVE_ELASTIC='4:2' is not valid"):
        elastic.Manager(store=store)
