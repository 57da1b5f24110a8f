"""The fuzz targets of fuzz/ (one per parser that reads a peer's bytes; docs/security.md).

Two things per run of the suite: every input of the checked-in corpus keeps the
parser's contract (in this process, without a fuzzer: the seeds made from real traffic
and the crash inputs the fuzzers found, `regression-*`, each of which was a bug), and
each target runs under atheris for PYCOLLECTIVE_FUZZ_SECONDS (default 1; `make fuzz`
runs a minute each, `make faults` several), all at once, each in its own process. Any
crash, broken contract, hang or blown memory bound fails the test, naming the input
libFuzzer wrote and the command that replays it.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import time
from pathlib import Path

import pytest
from fuzz import TARGETS
from fuzz import run as fuzz_run
from tests._launch import REPO

from pycollective import _serialize
from pycollective._errors import CollectiveError, StoreError
from pycollective.shm import arena as shm_arena

SECONDS = float(os.environ.get("PYCOLLECTIVE_FUZZ_SECONDS", "1"))
CORPUS = REPO / "fuzz" / "corpus"


def _seeds(target: str) -> list[Path]:
    return sorted(p for p in (CORPUS / target).iterdir() if p.is_file())


@pytest.mark.parametrize("target", TARGETS)
def test_every_corpus_input_keeps_the_contract(target: str) -> None:
    if target == "arena_words" and not shm_arena.available():
        pytest.skip("no writable /dev/shm: the arena (and its target) cannot run here")
    check = importlib.import_module(f"fuzz.targets.{target}").check
    seeds = _seeds(target)
    assert len(seeds) >= 8, (
        f"fuzz/corpus/{target} has {len(seeds)} seeds: python -m fuzz.make_corpus"
    )
    for path in seeds:
        try:
            check(path.read_bytes())
        except BaseException as exc:
            raise AssertionError(f"fuzz/corpus/{target}/{path.name}: {exc!r}") from exc


@pytest.mark.timeout(300)
def test_the_fuzzers_find_nothing(tmp_path) -> None:
    """Every target under atheris (a test dependency) for a second or so, concurrently."""
    procs = {}
    for target in TARGETS:
        if target == "arena_words" and not shm_arena.available():
            continue  # no arena here (test_every_corpus_input_keeps_the_contract says so)
        cmd = fuzz_run.command(target, SECONDS, tmp_path / target)
        procs[target] = subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    failures, lines = [], []
    for target, proc in procs.items():
        out, _ = proc.communicate(timeout=SECONDS + 200)
        r = fuzz_run.parse(target, proc.returncode, out, time.monotonic())
        lines.append(fuzz_run.report(r))
        if not r.ok:
            failures.append(fuzz_run.report(r))
    print("\n".join(lines))
    assert not failures, "\n\n".join(failures)


# ---------------------------------------------------------------------- what they found


def test_a_store_answer_that_is_no_integer_is_a_store_error() -> None:
    """store_client found it: add() and num_keys() raised ValueError from int() on a
    server's answer; wait() raised ProtocolError on a broken list of missing keys."""
    check = importlib.import_module("fuzz.targets.store_client").check
    for name in (
        "regression-add-answer-not-an-integer",
        "regression-add-answer-with-a-zero-byte",
        "regression-wait-missing-keys-truncated",
    ):
        check((CORPUS / "store_client" / name).read_bytes())  # raises if not a StoreError
    assert issubclass(StoreError, CollectiveError)


@pytest.mark.parametrize(
    "name, says",
    [
        ("regression-dtype-name-numpy-parses-as-python", "bad dtype"),  # SyntaxError before
        ("regression-shape-past-numpy-limit", "no array of shape"),  # ValueError before
        ("regression-tensor-of-long-double", "no tensor of dtype"),  # TypeError before
        ("regression-tensor-of-big-endian-array", "no tensor of dtype"),  # ValueError before
        ("regression-tensor-shape-past-torch-limit", "tensor of shape"),  # TypeError before
    ],
)
def test_a_payload_the_fuzzer_found_is_a_malformed_payload(name: str, says: str) -> None:
    if "tensor" in name:
        pytest.importorskip("torch")
    data = (CORPUS / "serialize" / name).read_bytes()
    with pytest.raises(CollectiveError, match=f"malformed object payload: .*{says}"):
        _serialize.loads(_serialize.MAGIC + data, pickling=False)
