"""How long a TCP exchange polls before it sleeps (transport/tcp/progress.py): the budget
is quartered when polling did not pay, and falls to 0 only while the machine is busy
(more runnable tasks than CPUs, /proc/loadavg). On a quiet machine it stays at
SPIN_SECONDS at least, so a peer that was held up once does not leave every later call
sleeping until the retry 64 exchanges on (2 hosts x 1, 4-64 B: runs at 0.40x OpenMPI
before, >= 1x after). The load is a fake loadavg file; the exchanges are real, over a
socket pair."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from tests.transport.test_swap_path import _data_header, _regular, _transports

from pycollective._load import MachineLoad
from pycollective.transport.tcp.state import SPIN_SECONDS


def _load(tmp_path: Path, runnable: int) -> MachineLoad:
    path = tmp_path / f"loadavg-{runnable}"
    path.write_text(f"0.50 0.40 0.30 {runnable}/300 4242\n")
    return MachineLoad(2, path=str(path))


@pytest.mark.parametrize(
    ("runnable", "before", "after"),
    [
        (2, 200e-6, 50e-6),  # quiet (2 runnable, 2 CPUs): a quarter
        (2, 50e-6, SPIN_SECONDS),  # ... but not below SPIN_SECONDS
        (2, 4e-6, SPIN_SECONDS),
        (3, 200e-6, 50e-6),  # busy: a quarter
        (3, 50e-6, 12.5e-6),
        (3, 4e-6, 0.0),  # ... down to 0
    ],
)
def test_a_missed_budget_falls_to_zero_only_on_a_busy_machine(
    tmp_path: Path, runnable: int, before: float, after: float
) -> None:
    t0, t1, _, _ = _transports()
    t0._spin_load = _load(tmp_path, runnable)
    assert t0._spin_missed(before) == pytest.approx(after)
    t0.close()
    t1.close()


def test_switched_off_the_load_never_makes_it_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYCOLLECTIVE_LOAD_AWARE", "0")
    t0, t1, _, _ = _transports()
    assert t0._spin_missed(4e-6) == SPIN_SECONDS
    t0.close()
    t1.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("runnable", "polls"), [(2, True), (3, False)], ids=["quiet", "busy"])
def test_a_zero_budget_polls_again_at_once_only_on_a_quiet_machine(
    tmp_path: Path, runnable: int, polls: bool
) -> None:
    """Budget 0, the peer's frame already on the wire: on a quiet machine the exchange
    polls (SPIN_SECONDS), finds it and doubles the budget; on a busy one it sleeps in the
    selector and counts towards the retry."""
    t0, t1, _, _ = _transports()
    t0._spin_load = _load(tmp_path, runnable)
    t0._spin, t0._unspun = 0.0, 0  # (SPIN_RETRY exchanges from the retry)
    h = _data_header(0, 16)
    got1 = bytearray(16)
    peer = threading.Thread(
        target=_regular, args=(t1, h, bytes(range(16)), got1, time.monotonic() + 10)
    )
    peer.start()
    time.sleep(0.05)  # its frame is there
    got0 = bytearray(16)
    _regular(t0, h, bytes(16), got0, time.monotonic() + 10)
    peer.join()
    assert bytes(got0) == bytes(range(16))
    if polls:
        assert t0._spin == pytest.approx(2 * SPIN_SECONDS) and t0._unspun == 0
    else:
        assert t0._spin == 0.0 and t0._unspun == 1
    t0.close()
    t1.close()
