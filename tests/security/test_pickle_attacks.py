"""Pickles sent to every receiver of objects: nothing from a peer is unpickled unless the
user chose pickle, never from a peer that proved nothing, and never when the bytes were
changed on the way. Each attack's pickle, if it ran, would create a file: the file must
not exist afterwards.

Findings 2 and 3 of the security review: elastic state transfer called pickle.loads
directly whatever the setting; an attacker on the path could inject pickles into object
collectives even with a secret.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from tests._launch import REPO, run_ranks

from pycollective import _keys
from pycollective._errors import CollectiveError, MismatchError
from pycollective.api import objects
from pycollective.store import HashStore

pytestmark = pytest.mark.timeout(90)
WORKER = REPO / "tests" / "security" / "_attack_worker.py"


def _last(result) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


class _Boom:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize(
    "serializer, internal, sealed, refusal",
    [
        # elastic's state transfer: a job member's pickle, refused (the library's own
        # transfers never unpickle unless the job chose pickle)
        ("auto", "1", "1", "pickle-free format"),
        ("safe", "1", "1", "accepts only the pickle-free"),
        ("safe", "0", "1", "accepts only the pickle-free"),
        # an attacker on the path, without the key: refused before anything is decoded,
        # even where pickles are allowed
        ("pickle", "1", "0", "does not carry this job's MAC"),
        ("auto", "0", "0", "does not carry this job's MAC"),
    ],
)
def test_pickles_sent_to_a_receiver_of_objects_are_not_unpickled(
    tmp_path, serializer: str, internal: str, sealed: str, refusal: str
) -> None:
    boom = tmp_path / "boom"
    env = {
        "PYCOLLECTIVE_OBJECT_SERIALIZER": serializer,
        "INTERNAL": internal,
        "SEAL": sealed,
        "BOOM_FILE": str(boom),
    }
    results = run_ranks(WORKER, 2, ("state-pickle",), env=env, timeout=80)
    got = _last(results[0])
    assert got["ok"] and got["error"] in ("MismatchError", "CollectiveError"), got
    assert refusal in got["msg"], got
    assert not boom.exists(), "the attacker's pickle ran"


def test_the_job_chose_pickle_and_a_member_pickles_state_then_it_loads(tmp_path) -> None:
    """The control: with PYCOLLECTIVE_OBJECT_SERIALIZER=pickle a sealed pickle from a job
    member is read (the user chose it), so the refusals above are the rule working."""
    boom = tmp_path / "boom"
    env = {"PYCOLLECTIVE_OBJECT_SERIALIZER": "pickle", "INTERNAL": "1", "SEAL": "1"}
    env["BOOM_FILE"] = str(boom)
    results = run_ranks(WORKER, 2, ("state-pickle",), env=env, timeout=80)
    assert _last(results[0])["error"] is None
    assert boom.exists()


class _Group:
    """Enough of a ProcessGroup for _Seal (group id, its counters, the world's key)."""

    def __init__(self, key: _keys.JobKey, rank: int = 0) -> None:
        self.group_id = 77
        self.object_calls = 0
        self.object_pairs: dict[int, int] = {}
        self._seq = 0
        self.failed = None

        class _World:
            pass

        self.world = _World()
        self.world.key = key
        self.world.rank = rank

    def fail(self, exc, seq) -> None:
        self.failed = exc


KEY = _keys.JobKey(b"object-seal-tests-key-0123456789", "tests")


def test_a_payload_changed_on_the_way_is_refused_before_decoding(tmp_path) -> None:
    sender, receiver = _Group(KEY, rank=1), _Group(KEY, rank=0)
    sealed = objects._Seal(sender).seal({"step": 3}).tobytes()
    evil = pickle.dumps(_Boom(str(tmp_path / "boom")))
    forged = evil + sealed[-objects.MAC_BYTES :]  # the MAC of another payload
    with pytest.raises(CollectiveError, match="changed on the way"):
        objects._Seal(receiver).open(forged, 1)
    assert receiver.failed is not None  # and the group is told
    assert not (tmp_path / "boom").exists()
    assert objects._Seal(_Group(KEY)).open(sealed, 1) == {"step": 3}  # the real one reads


def test_a_payload_of_another_call_or_sender_is_refused() -> None:
    a = objects._Seal(_Group(KEY, rank=1)).seal([1, 2]).tobytes()
    receiver = _Group(KEY)
    receiver.object_calls = 5  # a later call: the recorded payload is of call 0
    with pytest.raises(CollectiveError, match="another call"):
        objects._Seal(receiver).open(a, 1)
    with pytest.raises(CollectiveError, match="MAC"):
        objects._Seal(_Group(KEY)).open(a, 2)  # rank 2 did not send it


def test_with_no_key_pickles_are_refused_outright() -> None:
    """PYCOLLECTIVE_INSECURE=1: peers proved nothing, so nothing they send is unpickled."""
    insecure = _keys.JobKey(b"", "PYCOLLECTIVE_INSECURE=1", insecure=True)
    sender = objects._Seal(_Group(insecure, rank=1))
    assert sender.seal({"a": 1}).tobytes().startswith(b"PCS1")  # sends no pickle either
    payload = pickle.dumps({"a": 1})
    sealed = payload + sender._mac(1, 0, payload)
    with pytest.raises(MismatchError, match="pickle"):
        objects._Seal(_Group(insecure)).open(sealed, 1)


@pytest.mark.timeout(120)
def test_object_collectives_under_the_opt_out_use_the_safe_format(tmp_path) -> None:
    env = {"PYCOLLECTIVE_INSECURE": "1"}
    results = run_ranks(WORKER, 3, ("objects",), env=env, timeout=100)
    for r in results:
        assert r.returncode == 0, r.stderr
        assert _last(r)["ok"], r.stdout
        assert "PYCOLLECTIVE_INSECURE=1: this job authenticates nobody" in r.stderr


def test_the_stores_never_unpickle() -> None:
    """A store keeps bytes as bytes: a pickle set by a peer comes back as the same bytes."""
    store = HashStore()
    evil = pickle.dumps(_Boom("/nonexistent/x"))
    store.set("k", evil)
    assert store.get("k") == evil
    assert isinstance(np.frombuffer(store.get("k"), np.uint8), np.ndarray)
