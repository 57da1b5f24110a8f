"""The job's key (pycollective._keys): a job never runs on a key anyone can compute.

Findings 1 and 9 of the security review: with no secret set the HMAC key was the empty
string (anyone could join); the launcher used PYCOLLECTIVE_SECRET raw while ranks stripped
it; a secret file readable by others was accepted.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest
from tests._launch import REPO, run_ranks

from pycollective import _keys
from pycollective._errors import UsageError

WORKER = REPO / "tests" / "security" / "_attack_worker.py"


def _env(tmp_path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLLECTIVE_SECRET")}
    env.pop("PYCOLLECTIVE_INSECURE", None)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    env.update(extra)
    return env


def test_no_secret_means_the_per_user_key_file_made_private(tmp_path) -> None:
    env = _env(tmp_path)
    key = _keys.job_key(env)
    path = tmp_path / "config" / "pycollective" / "secret"
    assert key.source == f"the per-user key file {path}" and not key.insecure
    assert len(key.secret) == 64  # 32 random bytes, hex
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert _keys.job_key(env) == key  # read again, not made again
    assert key.fingerprint not in ("", key.secret.decode())
    assert key.secret.decode() not in repr(key)


def test_processes_starting_at_once_agree_on_one_key(tmp_path) -> None:
    code = textwrap.dedent(
        """
        from pycollective import _keys
        print(_keys.job_key().fingerprint)
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=_env(tmp_path), stdout=subprocess.PIPE, text=True
        )
        for _ in range(6)
    ]
    prints = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(prints) == 1 and all(p.returncode == 0 for p in procs), prints


def test_the_key_file_of_another_user_or_readable_by_others_is_refused(tmp_path) -> None:
    env = _env(tmp_path)
    key = _keys.job_key(env)
    path = tmp_path / "config" / "pycollective" / "secret"
    path.chmod(0o644)
    with pytest.raises(UsageError, match="mode 0644.*chmod 600"):
        _keys.job_key(env)
    path.chmod(0o600)
    os.chown(path, 65534, 65534)  # "another user" (the tests run as root)
    try:
        with pytest.raises(UsageError, match="owned by uid 65534"):
            _keys.job_key(env)
    finally:
        os.chown(path, os.geteuid(), os.getegid())
    assert _keys.job_key(env) == key


def test_a_planted_symlink_is_not_followed(tmp_path) -> None:
    folder = tmp_path / "config" / "pycollective"
    folder.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("attacker-chosen key\n")
    victim.chmod(0o600)
    (folder / "secret").symlink_to(victim)
    with pytest.raises(UsageError, match="symbolic link"):
        _keys.job_key(_env(tmp_path))


def test_a_secret_file_readable_by_others_is_refused(tmp_path) -> None:
    f = tmp_path / "job.key"
    f.write_text("  a-long-random-secret-for-this-job  \n")
    f.chmod(0o640)
    with pytest.raises(UsageError, match="mode 0640"):
        _keys.job_key(_env(tmp_path, PYCOLLECTIVE_SECRET_FILE=str(f)))
    f.chmod(0o600)
    key = _keys.job_key(_env(tmp_path, PYCOLLECTIVE_SECRET_FILE=str(f)))
    assert key.secret == b"a-long-random-secret-for-this-job"


def test_the_secret_is_stripped_alike_everywhere(tmp_path) -> None:
    raw = "  padded-secret-of-some-length \t"
    a = _keys.job_key(_env(tmp_path, PYCOLLECTIVE_SECRET=raw))
    b = _keys.job_key(_env(tmp_path, PYCOLLECTIVE_SECRET=raw.strip()))
    assert a.secret == b.secret == raw.strip().encode()


def test_an_empty_key_needs_the_loud_opt_out(tmp_path) -> None:
    with pytest.raises(UsageError, match="empty key authenticates nobody"):
        _keys.as_key(b"")
    env = _env(tmp_path, PYCOLLECTIVE_INSECURE="1")
    with pytest.warns(UserWarning, match="PYCOLLECTIVE_INSECURE=1: this job authenticates nobody"):
        key = _keys.job_key(env)
    assert key.insecure and key.secret == b""
    assert not (tmp_path / "config" / "pycollective" / "secret").exists()


def test_a_short_secret_is_warned_about(tmp_path) -> None:
    code = "from pycollective import _keys; _keys.job_key()"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(tmp_path, PYCOLLECTIVE_SECRET="abc"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "3 characters" in out.stderr and "openssl rand" in out.stderr


@pytest.mark.timeout(90)
def test_ranks_whose_keys_differ_fail_at_once_saying_what_to_set(tmp_path) -> None:
    """Two hosts that do not share a home: each has a key file of its own. The rank that
    connects learns it in its first handshake, not at the timeout."""
    env = _env(tmp_path, PYCOLLECTIVE_TIMEOUT="60")
    results = run_ranks(
        WORKER,
        2,
        ("allreduce",),
        env=env,
        per_rank_env={
            0: {"PYCOLLECTIVE_TIMEOUT": "4"},
            1: {"XDG_CONFIG_HOME": str(tmp_path / "other-home")},
        },
        timeout=80,
    )
    rank0, rank1 = results
    # rank 0, started by hand, waits for rank 1 until its timeout, then says why
    assert rank0.returncode != 0 and "the store refused meanwhile" in rank0.stderr, rank0.stderr
    assert "whose key differs" in rank0.stderr
    assert rank1.returncode != 0
    assert "key differs" in rank1.stderr and "PYCOLLECTIVE_SECRET" in rank1.stderr, rank1.stderr
    assert str(tmp_path / "other-home" / "pycollective" / "secret") in rank1.stderr
    assert (
        "elapsed" not in rank1.stdout or json.loads(rank1.stdout.splitlines()[-1])["elapsed"] < 20
    )


@pytest.mark.timeout(90)
def test_a_job_with_no_secret_runs_authenticated_with_no_extra_step(tmp_path) -> None:
    """torchrun, mpirun, srun, mp.spawn and tcp:// users set nothing: their ranks find the
    per-user key file, and say so in the log."""
    env = _env(tmp_path, PYCOLLECTIVE_DEBUG="INFO")
    results = run_ranks(WORKER, 3, ("allreduce",), env=env, timeout=80)
    for r in results:
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.splitlines()[-1])["ok"], r.stdout
    fingerprint = _keys.job_key(env).fingerprint
    assert f"key {fingerprint} from the per-user key file" in results[0].stderr
