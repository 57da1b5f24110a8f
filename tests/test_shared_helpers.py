"""The helpers every command shares: one size rule (pycollective._units) and one
connect-with-retry (pycollective._netutil), used by the store and the transport alike."""

from __future__ import annotations

import argparse
import socket
import threading
import time
from pathlib import Path

import pytest

from pycollective import _netutil, _units
from pycollective._errors import UsageError
from pycollective.cli import simulate

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    "text, nbytes",
    [
        ("4096", 4096), ("4 B", 4), ("64K", 64 << 10), ("64k", 64 << 10), ("64KB", 64 << 10),
        ("64KiB", 64 << 10), ("64 kib", 64 << 10), ("1MB", 1 << 20), ("1M", 1 << 20),
        ("1MiB", 1 << 20), ("1.5MB", 3 << 19), ("2G", 2 << 30), ("1TiB", 1 << 40),
    ],
)  # fmt: skip
def test_one_binary_rule_for_every_spelling(text, nbytes):
    assert _units.parse_size(text) == nbytes
    assert simulate.parse_bytes(text) == nbytes  # simulate reads sizes as bench does


@pytest.mark.parametrize("bad", ["", "MB", "1.5", "0.3KiB", "4 bytes", "-4", "1e"])
def test_bad_sizes_say_what_is_accepted(bad):
    with pytest.raises(UsageError, match="size|whole number"):
        _units.parse_size(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        _units.size_arg(bad)


def test_human_sizes_round_trip():
    for n in (0, 1, 4, 1023, 1024, 1536, 1 << 20, 256 << 20, 3 << 30):
        assert _units.parse_size(_units.human_bytes(n)) == n
    assert _units.human_bytes(256 << 10) == "256 KiB"
    assert _units.human_bytes(12) == "12 B"


def test_connect_with_retry_waits_for_a_late_listener():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_later() -> None:
        time.sleep(0.3)
        srv.bind(("127.0.0.1", port))
        srv.listen()

    t = threading.Thread(target=listen_later)
    t.start()
    try:
        sock = _netutil.connect_with_retry("127.0.0.1", port, time.monotonic() + 10)
        sock.close()
    finally:
        t.join()
        srv.close()


def test_connect_with_retry_gives_up_at_the_deadline():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens here
    t0 = time.monotonic()
    with pytest.raises(OSError):
        _netutil.connect_with_retry("127.0.0.1", port, time.monotonic() + 0.5)
    assert time.monotonic() - t0 < 3


def test_workers_report_through_one_helper(capsys):
    """tests/_workerlib.py's report/attempt, as tests/_launch.py's steps_of reads them; and no
    worker script defines its own again."""
    import ast
    from pathlib import Path

    from tests import _launch, _workerlib

    assert _workerlib.attempt("ok", lambda: None) is None
    err = _workerlib.attempt("bad", lambda: (_ for _ in ()).throw(UsageError("no")))
    assert isinstance(err, UsageError)
    with pytest.raises(KeyError):  # not caught: fails the worker
        _workerlib.attempt("other", lambda: {}["x"], catch=UsageError)
    out = capsys.readouterr().out
    steps = _launch.steps_of(_launch.RankResult(0, 0, out, ""))
    assert set(steps) == {"ok", "bad"}
    assert steps["ok"]["error"] is None and steps["ok"]["elapsed"] >= 0
    assert steps["bad"]["error"] == "UsageError" and steps["bad"]["msg"] == "no"
    assert "CollectiveError" in steps["bad"]["bases"] and steps["bad"]["waiting_on"] == []
    tests = Path(__file__).resolve().parent
    for path in set(tests.rglob("_*worker*.py")) - {tests / "_workerlib.py"}:
        defs = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        assert not defs & {"report", "attempt"}, f"{path}: use tests/_workerlib.py"


def test_ranks_hand_shake_through_marks(tmp_path, monkeypatch):
    """_workerlib's mark/wait_for (what a rank kept out of a call waits on instead of a nap):
    wait_for returns once every rank named has marked, in whatever order, and raises when
    one never does; run_ranks gives each job a directory of its own and removes it."""
    from tests import _launch, _workerlib

    monkeypatch.setenv(_workerlib.MARKS, str(tmp_path))
    threading.Timer(0.1, _workerlib.mark, ("ready", 1)).start()
    _workerlib.mark("ready", 0)
    t0 = time.monotonic()
    _workerlib.wait_for("ready", [0, 1], timeout=30)
    assert time.monotonic() - t0 < 20
    with pytest.raises(TimeoutError, match="did not mark 'ready'"):
        _workerlib.wait_for("ready", [0, 2], timeout=0.2)
    script = tmp_path / "x.py"
    script.write_text("import os; d = os.environ['TEST_MARKS']; print(d, os.path.isdir(d))")
    (a,) = _launch.run_ranks(script, 1)
    (b,) = _launch.run_ranks(script, 1)
    assert a.returncode == 0 and a.stdout.split()[1] == "True", a.stderr
    assert a.stdout.split()[0] != b.stdout.split()[0]
    assert not Path(a.stdout.split()[0]).exists()


def test_run_bounded_fails_a_busy_loop_on_its_cpu_time_and_a_blocked_child_on_the_wall():
    """tests/_launch.py's run_bounded, the no-hang bound of short commands: a spinning child
    dies of its CPU limit (1 s of its own CPU, however loaded the machine), a sleeping one
    at the wall bound, and a quick one's result comes back whole."""
    import sys

    from tests import _launch

    ok = _launch.run_bounded([sys.executable, "-c", "print('out'); raise SystemExit(3)"],
                             cpu_seconds=20)  # fmt: skip
    assert (ok.returncode, ok.stdout) == (3, "out\n")
    with pytest.raises(AssertionError, match="more than 1 s of CPU"):
        _launch.run_bounded([sys.executable, "-c", "while True: pass"], cpu_seconds=1)
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="still ran after 0.5 s"):
        _launch.run_bounded([sys.executable, "-c", "import time; time.sleep(30)"],
                            cpu_seconds=20, wall_seconds=0.5)  # fmt: skip
    assert time.monotonic() - t0 < 25  # killed at the bound, not left to sleep its 30 s
