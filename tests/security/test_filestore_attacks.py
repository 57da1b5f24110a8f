"""Attacks on FileStore in a shared directory (issue 18, finding 8: it opened the path
without O_NOFOLLOW or ownership checks, so a pre-created file injects keys).

An attacker who can create names where a job's store file will be (a shared /tmp, a
project directory) plants: a file of their own holding keys (the job would read them:
addresses to connect to, counters), a file of the job's user left open to others, or a
link to a victim's file (the job would append records to it and unlink the link). Each is
refused with a message saying what to do; a job pointed at one fails at once on every
rank, and the victim's file and the job's results on a fresh path are intact.

Runs as root: chown to uid 65534 (nobody) plays another user."""

from __future__ import annotations

import os
import stat
import struct
import subprocess
import sys

import pytest
from tests._launch import REPO

from pycollective._errors import StoreError
from pycollective.store.file import FileStore

NOBODY = 65534
WORKER = REPO / "tests" / "api" / "init_worker.py"


def _record(key: str, value: bytes) -> bytes:
    k = key.encode()
    return struct.pack("!cII", b"S", len(k), len(value)) + k + value


def _plant(path, mode: int = 0o666, owner: int | None = NOBODY) -> bytes:
    """A store file with a key the job never set, as another user would leave it."""
    data = _record("injected", b"evil") + _record("pg/0/addr", b"10.6.6.6:1")
    path.write_bytes(data)
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner, owner)
    return data


@pytest.fixture
def shared(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o1777)  # a directory everyone may create names in, like /tmp
    return d


@pytest.mark.parametrize("mode", [0o600, 0o666], ids=oct)
def test_store_file_of_another_user_with_injected_keys_is_refused(shared, mode) -> None:
    path = shared / "store"
    planted = _plant(path, mode=mode)
    with pytest.raises(StoreError, match=f"owned by uid {NOBODY}") as info:
        FileStore(path, timeout=5)
    assert str(path) in str(info.value) and "another path" in str(info.value)
    assert path.read_bytes() == planted  # not joined, not counted, not removed


@pytest.mark.parametrize("mode", [0o644, 0o660, 0o606], ids=oct)
def test_store_file_of_ours_open_to_others_is_refused_with_the_fix(shared, mode) -> None:
    path = shared / "store"
    planted = _plant(path, mode=mode, owner=None)
    with pytest.raises(StoreError, match=f"chmod 600 {path}"):
        FileStore(path, timeout=5)
    assert path.read_bytes() == planted


def test_store_path_that_is_a_link_to_a_victims_file_is_refused(shared, tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.chmod(victim, 0o600)  # private and ours: only the link is wrong
    link = shared / "store"
    link.symlink_to(victim)
    with pytest.raises(StoreError, match="symbolic link"):
        FileStore(link, timeout=5)
    assert victim.read_bytes() == b"precious" and link.is_symlink()


def test_store_file_with_other_names_is_refused(shared, tmp_path) -> None:
    """A hard link planted to a file of the job's user: records would go into that file."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"")
    os.chmod(victim, 0o600)
    os.link(victim, shared / "store")
    with pytest.raises(StoreError, match="2 names"):
        FileStore(shared / "store", timeout=5)
    assert victim.read_bytes() == b""


def test_new_store_file_is_0600_whatever_the_umask(shared) -> None:
    old = os.umask(0)
    try:
        store = FileStore(shared / "store", timeout=5)
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(shared / "store").st_mode) == 0o600
        store.set("k", b"v")
        again = FileStore(shared / "store", timeout=5)  # a second rank joins it
        assert again.get("k") == b"v"
        again.close()
    finally:
        store.close()


def _job(where: str, world: int = 2) -> list[subprocess.CompletedProcess[str]]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYCOLLECTIVE_TIMEOUT"] = "20"
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "file", str(r), str(world), where],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(world)
    ]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=60)
            out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return out


@pytest.mark.timeout(120)
def test_job_at_a_planted_store_file_fails_on_every_rank_and_a_fresh_path_works(shared) -> None:
    """A real 2-rank job (init_method=file://) at another user's pre-created store file:
    every rank stops at once with the refusal (no rank waits for the other, none reads the
    injected keys); the same job at a fresh path in the same directory gives the right
    answer."""
    planted_path = shared / "store"
    planted = _plant(planted_path)
    for result in _job(str(planted_path)):
        assert result.returncode != 0
        assert "StoreError" in result.stderr and f"owned by uid {NOBODY}" in result.stderr
    assert planted_path.read_bytes() == planted
    results = _job(str(shared / "fresh"))
    for r, result in enumerate(results):
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip() == f"rank {r}/2 sum=[3, 3, 3] bcast=[1]"
    assert not (shared / "fresh").exists()  # the last rank to leave removed it
