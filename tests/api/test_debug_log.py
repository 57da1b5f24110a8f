"""PYCOLLECTIVE_DEBUG, the switch users know from NCCL_DEBUG: INFO logs the job's few facts
(rendezvous), DETAIL adds at DEBUG the algorithm each distinct call runs and every call;
unset, the library says nothing (a NullHandler) and does not even build the messages. A
program that logs at INFO itself (Ray's workers do) sees the same few lines, however many
call signatures it runs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pycollective as dist
from pycollective import _log
from pycollective._errors import UsageError

pytestmark = pytest.mark.timeout(60)

JOB = textwrap.dedent(
    """
    import numpy as np, pycollective as dist
    dist.init_process_group()
    x = np.ones(256, dtype=np.float32)
    for _ in range(3):
        dist.all_reduce(x)
    dist.all_reduce(x, algorithm="ring")
    dist.destroy_process_group()
    """
)


def job(**env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "PYCOLLECTIVE_DEBUG"}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "pycollective", "run", "-n", "2", sys.executable, "-c", JOB],
        capture_output=True, text=True, timeout=50, env=full,
    )  # fmt: skip


def ours(stderr: str, rank: int) -> list[str]:
    prefix = f"[rank {rank}]: pycollective "
    return [line[len(prefix) :] for line in stderr.splitlines() if line.startswith(prefix)]


def test_info_names_rendezvous_and_detail_adds_choices_once_and_every_call():
    res = job(PYCOLLECTIVE_DEBUG="INFO")
    assert res.returncode == 0, res.stderr
    for rank in (0, 1):
        lines = ours(res.stderr, rank)
        text = "\n".join(lines)
        assert f"init_process_group: rank {rank} of 2" in text and "started by pycollective" in text
        assert "TCP mesh of 2 ranks up in" in text
        assert "joined 2 ranks in" in text
        assert not [line for line in lines if "all_reduce of" in line], lines  # DEBUG now
        assert not [line for line in lines if line.startswith("DEBUG")]
    res = job(PYCOLLECTIVE_DEBUG="detail")
    assert res.returncode == 0, res.stderr
    lines = ours(res.stderr, 0)
    debug = [line for line in lines if line.startswith("DEBUG")]
    chose = [line for line in debug if "all_reduce of 1024 bytes" in line]
    assert len(chose) == 2, lines  # auto's choice once (3 calls), then the asked ring
    assert "auto chose" in chose[0] and chose[1].endswith("ring (asked)")
    calls = [line for line in debug if "all_reduce#" in line]
    assert len(calls) == 4, calls
    assert calls[-1].endswith("(ring, 256 x float32)")


# A program that configures logging at INFO for its own sake, as Ray's workers do, and runs
# `signatures` distinct calls (sizes, collectives, dtypes).
MANY = textwrap.dedent(
    """
    import logging, sys
    import numpy as np, pycollective as dist
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="LOG %(levelname)s %(name)s: %(message)s")
    n = int(sys.argv[1])
    dist.init_process_group()
    for k in range(1, n + 1):
        dist.all_reduce(np.ones(k, dtype=np.float32))
        dist.broadcast(np.ones(k, dtype=np.int64), src=k % 2)
        dist.all_reduce(np.ones(k, dtype=np.float64), op=dist.ReduceOp.MAX)
    dist.destroy_process_group()
    """
)


def info_lines(signatures: int) -> list[list[str]]:
    full = {k: v for k, v in os.environ.items() if k != "PYCOLLECTIVE_DEBUG"}
    res = subprocess.run(
        [sys.executable, "-m", "pycollective", "run", "-n", "2", sys.executable, "-c", MANY,
         str(signatures)],
        capture_output=True, text=True, timeout=50, env=full,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return [
        [
            line
            for line in res.stderr.splitlines()
            if line.startswith(f"[rank {rank}]: LOG ") and " pycollective" in line
        ]
        for rank in (0, 1)
    ]


def test_info_lines_of_a_job_do_not_grow_with_its_call_signatures():
    one = info_lines(1)  # 3 signatures
    many = info_lines(100)  # 300
    for rank in (0, 1):
        assert 1 <= len(one[rank]) <= 4, one[rank]
        assert len(many[rank]) == len(one[rank]), many[rank]
        assert not [line for line in many[rank] if " of " in line and "bytes" in line]


def test_off_by_default_quiet_and_cheap(monkeypatch):
    logger = logging.getLogger("pycollective")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    assert not logger.isEnabledFor(logging.INFO)
    monkeypatch.delenv("PYCOLLECTIVE_DEBUG", raising=False)
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYCOLLECTIVE_STORE_HOSTED"):
        monkeypatch.delenv(key, raising=False)

    def fail(*args, **kwargs):
        raise AssertionError("a call was noted with the debug log off")

    monkeypatch.setattr(_log, "note_call", fail)
    dist.init_process_group()
    try:
        dist.all_reduce(np.ones(8))
    finally:
        dist.destroy_process_group()
    res = job()
    assert res.returncode == 0 and "pycollective INFO" not in res.stderr, res.stderr


def test_a_bad_level_is_named(monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_DEBUG", "verbose")
    with pytest.raises(UsageError, match=r"PYCOLLECTIVE_DEBUG='verbose' .* INFO \| DETAIL \| OFF"):
        dist.init_process_group()
    assert not dist.is_initialized()
    monkeypatch.setenv("PYCOLLECTIVE_DEBUG", "OFF")
    _log.configure()
    assert not logging.getLogger("pycollective").isEnabledFor(logging.INFO)
