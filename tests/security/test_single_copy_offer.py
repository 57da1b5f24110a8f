"""A peer's single-copy offer in the arena's set-up exchange (docs/security.md, "Single
copy"): a member may only be reached at the pid it proved to be its own.

The proof is a nonce read back from the offered pid at the offered address. A member that
replays this rank's own offer passes that proof (a process may always read itself), as
does one that replays another member's: then single copy would read and write, at
addresses the liar's shared words name, in this rank's own memory or that member's, which
the system's rules (Yama's ptrace scope) would not have let the liar touch. Every pid must
therefore be distinct and none a peer's but this rank's own: else the group keeps the
arena's copies (no single copy) on every rank.

Sans-IO: the set-up records are built by hand, as an attacker would send them, and judged
by the function the set-up uses; the honest cases alongside show the check is not simply
refusing everything."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from pycollective.runners import arena as _runner
from pycollective.shm import native as _shm_native

pytestmark = pytest.mark.skipif(
    _shm_native._native is None, reason="the compiled core is not built (single copy is its)"
)

_HOLDER = """
import os, sys, numpy as np
nonce = np.frombuffer(os.urandom(8), np.uint8).copy()
print(os.getpid(), nonce.ctypes.data, nonce.tobytes().hex(), flush=True)
sys.stdin.read()  # holds the nonce until the test closes stdin
"""


def _offer(pid: int, addr: int, nonce: bytes) -> np.ndarray:
    record = np.zeros(_runner._RECORD, np.uint8)
    record[_runner._SC_PID : _runner._SC_PID + 8] = _runner._int64_bytes(pid)
    record[_runner._SC_ADDR : _runner._SC_ADDR + 8] = _runner._int64_bytes(addr)
    record[_runner._SC_NONCE : _runner._SC_NONCE + 8] = np.frombuffer(nonce, np.uint8)
    record[_runner._SC_OFFER] = 1
    return record


@pytest.fixture
def mine():
    """This rank's own honest offer (its nonce kept alive for the test)."""
    nonce = np.frombuffer(os.urandom(8), np.uint8).copy()
    yield _offer(os.getpid(), nonce.ctypes.data, nonce.tobytes()), nonce


@pytest.fixture
def member():
    """Another process's honest offer: a child holding its own nonce (a parent may read
    its child under every Yama scope but the strictest)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        pid, addr, nonce = child.stdout.readline().split()
        yield _offer(int(pid), int(addr), bytes.fromhex(nonce))
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_an_honest_peer_is_reached(mine, member) -> None:
    if not _runner._probe_peers(np.stack([mine[0], member]), 0):
        pytest.fail("an honest child's offer must pass (else the attacks below prove nothing)")


def test_a_peer_replaying_this_ranks_own_offer_is_refused(mine) -> None:
    own, _nonce = mine
    # It passes the nonce proof: this rank reads itself back.
    pid, addr = _runner._int64_at(own, _runner._SC_PID), _runner._int64_at(own, _runner._SC_ADDR)
    assert _shm_native.probe_peer(pid, addr, bytes(own[_runner._SC_NONCE : _runner._SC_NONCE + 8]))
    assert not _runner._probe_peers(np.stack([own, own.copy()]), 0)
    assert not _runner._probe_peers(np.stack([own.copy(), own]), 1)


def test_a_peer_replaying_another_members_offer_is_refused(mine, member) -> None:
    assert _runner._probe_peers(np.stack([mine[0], member]), 0)
    assert not _runner._probe_peers(np.stack([mine[0], member, member.copy()]), 0)


def test_an_offer_in_this_ranks_place_must_be_its_own(mine, member) -> None:
    # The records are the exchange's: this rank's slot holding another pid means the
    # exchange is not what this rank sent, so nothing is trusted.
    assert not _runner._probe_peers(np.stack([member, mine[0]]), 0)
