"""`make demo` at tiny sizes: its table's columns are computed from the runs (change a
measurement and the columns that depend on it move, and only those), the crossover rule
is read off the simulator's numbers, a tiny end-to-end run prints exactly the table of its
own results.json, the contention job runs on namespace hosts (root), and
examples/torch_basics.py runs under both imports."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
from tests._launch import REPO

EXAMPLE = REPO / "examples" / "fashion_mnist"
sys.path.insert(0, str(EXAMPLE))
import report  # noqa: E402

sys.path.remove(str(EXAMPLE))


def _results() -> dict:
    """A made-up results.json: 2 and 3 workers, the measurements round numbers."""

    def run(seconds, busiest, servers):
        return {"seconds": seconds, "times": [seconds], "busiest_bytes": busiest,
                "servers": servers}  # fmt: skip

    cont = {
        "network": "namespaces", "link_bps": 0.95e9, "reps": 1, "accumulate": 4,
        "compute": {"batch": 32, "seconds": 0.040},
        "runs": {
            "2": {"ring": run(0.25, 30e6, 0), "ps1": run(1.0, 60e6, 1), "psW": run(0.5, 30e6, 2)},
            "3": {"ring": run(0.33, 40e6, 0), "ps1": run(1.5, 90e6, 1), "psW": run(0.5, 30e6, 3)},
        },
    }  # fmt: skip
    measured = [{"algorithm": "ring", "ranks": w, "servers": 0, "seconds": t}
                for w, t in ((2, 0.24), (3, 0.32))]  # fmt: skip
    ps = ((2, 1, 0.9), (2, 2, 0.45), (3, 1, 1.35), (3, 3, 0.45))
    measured += [{"algorithm": "parameter_server", "ranks": w, "servers": s, "seconds": t}
                 for w, s, t in ps]  # fmt: skip
    runs = {
        "single": {"test_accuracy": 0.87, "bytes_sent_per_sample": 0.0, "workers": 1},
        "ring": {"test_accuracy": 0.868, "bytes_sent_per_sample": 469e3, "workers": 2},
        "ring_k": {"test_accuracy": 0.85, "bytes_sent_per_sample": 117e3, "workers": 2},
    }
    return {"config": {"model": "large"}, "contention": cont, "predict": {"measured": measured},
            "accuracy": {"runs": runs}}  # fmt: skip


def _row(rows, design, w):
    (r,) = [r for r in rows if r.design == design and r.workers == w]
    return r


def test_table_columns_come_from_the_measurements() -> None:
    res = _results()
    rows = report.table_rows(res)
    assert [(r.design, r.workers) for r in rows] == [
        ("single", 1), ("ring", 2), ("ring", 3), ("ring_k", 2), ("ring_k", 3),
        ("ps1", 2), ("ps1", 3), ("psW", 2), ("psW", 3),
    ]  # fmt: skip
    ring = _row(rows, "ring", 2)
    assert ring.comm_s == 0.25 and ring.predicted_s == 0.24
    assert ring.error == pytest.approx(-0.04)
    assert ring.step_s == pytest.approx(0.29)
    assert ring.samples_per_s == pytest.approx(64 / 0.29)
    assert ring.bytes_per_sample == pytest.approx(30e6 / 64)
    assert ring.accuracy == 0.868 and ring.trained_bytes_per_sample == 469e3
    acc = _row(rows, "ring_k", 2)  # 4 micro-batches of 32 per all-reduce
    assert acc.compute_s == pytest.approx(0.16) and acc.samples_per_update == 256
    assert acc.bytes_per_sample == pytest.approx(ring.bytes_per_sample / 4)
    assert acc.trained_bytes_per_sample == 117e3
    psw = _row(rows, "psW", 3)
    assert psw.servers == 3 and psw.predicted_s == 0.45 and psw.error == pytest.approx(-0.1)
    assert _row(rows, "ring", 3).accuracy is None  # trained at 2 workers only

    # Every column moves with its own measurement, and only with it.
    before = {(r.design, r.workers): r for r in rows}
    changed = copy.deepcopy(res)
    changed["contention"]["runs"]["3"]["ps1"]["seconds"] = 3.0
    changed["contention"]["runs"]["2"]["ring"]["busiest_bytes"] = 45e6
    changed["contention"]["compute"]["seconds"] = 0.080
    changed["predict"]["measured"][1]["seconds"] = 0.66
    changed["accuracy"]["runs"]["ring"]["test_accuracy"] = 0.5
    after = {(r.design, r.workers): r for r in report.table_rows(changed)}
    assert after["ps1", 3].comm_s == 3.0 and after["ps1", 3].error == pytest.approx(1.35 / 3 - 1)
    assert after["ps1", 2].comm_s == before["ps1", 2].comm_s
    assert after["ring", 2].busiest_bytes == 45e6 and after["ring_k", 2].busiest_bytes == 45e6
    assert after["ring", 3].busiest_bytes == before["ring", 3].busiest_bytes
    assert all(a.compute_s == 2 * before[k].compute_s for k, a in after.items())
    assert after["ring", 3].predicted_s == 0.66 and after["ring_k", 3].predicted_s == 0.66
    assert after["ring", 2].accuracy == 0.5 and after["ring_k", 2].accuracy == 0.85

    # over loopback the predictions (for a real link) are shown, but no error against them
    changed["contention"]["network"] = "loopback"
    assert all(r.error is None and r.predicted_s is not None for r in
               report.table_rows(changed)[1:])  # fmt: skip

    text = report.render_table(report.table_rows(res))
    line = next(ln for ln in text.splitlines() if ln.startswith("ring all-reduce ") and " 2 " in ln)
    assert line.split()[4:13] == ["250", "240", "-4%", "30.0", "MB", "469", "kB", "40", "290"]


def _grid(servers: list[int]) -> list[dict]:
    """Made-up predictions: the ring takes 1 s at every W; S servers take 0.6 W / S s."""
    rows = [{"algorithm": "ring", "ranks": w, "servers": 0, "seconds": 1.0} for w in range(2, 33)]
    for s in servers:
        rows += [{"algorithm": "parameter_server", "ranks": w, "servers": s,
                  "seconds": 0.6 * w / s} for w in range(2, 33)]  # fmt: skip
    rows += [{"algorithm": "parameter_server", "ranks": w, "servers": w, "seconds": 0.9,
              "equal": True} for w in (2, 4, 8)]  # fmt: skip
    return rows


def test_the_rule_is_read_off_the_predictions() -> None:
    # S servers win while 0.6 W / S < 1, i.e. for W <= 5 S / 3
    assert report.crossovers(_grid([3]), 3)["ps_wins"] == [[2, 4]]
    (text,) = report.rule({"grid": {"7": _grid([1, 3, 6, 30])}})
    assert text.startswith(
        "7 Gbit/s: ring all-reduce is faster than 1 server at every W from 2 to 32; "
        "with 3 servers, ring all-reduce is faster once W > 4 "
    )
    assert "with 6 servers, ring all-reduce is faster once W > 9 " in text
    assert "30 servers are faster from W = 2 to at least 32" in text
    assert "As many servers as workers (W more hosts) win from W = 2 (by up to 10%)" in text
    (short,) = report.short_rule({"grid": {"7": _grid([1, 3, 6])}})
    assert short == ("7 Gbit/s: ring all-reduce beats 1 server at every W <= 32; "
                     "with 3/6 servers it is faster once W > 4/9.")  # fmt: skip


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}


@pytest.mark.timeout(240)
def test_demo_end_to_end_prints_the_table_of_its_results(tmp_path) -> None:
    from tests.examples.test_fashion_mnist import _write_dataset

    (tmp_path / "data").mkdir()
    _write_dataset(tmp_path / "data", n_train=256, n_test=64)
    out = tmp_path / "out"
    cmd = [sys.executable, str(EXAMPLE / "demo.py"), "--model", "small", "--samples", "128",
           "--batch", "8", "--accumulate", "2", "--workers", "2", "--reps", "1",
           "--compute-steps", "3", "--eval-points", "2", "--probe", "32", "--max-workers", "8",
           "--loopback", "--data-dir", str(tmp_path / "data"), "--out", str(out)]  # fmt: skip
    res = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=230)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results) >= {"accuracy", "contention", "predict", "config", "load"}
    runs = results["accuracy"]["runs"]
    assert runs["ring"]["accumulate"] == 1 and runs["ring_k"]["accumulate"] == 2
    # the same all-reduce per update, so k micro-batches per update: k x fewer bytes per sample
    assert runs["ring_k"]["bytes_sent_per_step"] == pytest.approx(
        runs["ring"]["bytes_sent_per_step"], rel=1e-3
    )
    assert runs["ring_k"]["bytes_sent_per_sample"] * 2 == pytest.approx(
        runs["ring"]["bytes_sent_per_sample"], rel=1e-3
    )
    assert runs["ring"]["samples"] == runs["single"]["samples"] == runs["ring_k"]["samples"]
    # the printed table is the report of results.json, not numbers typed in
    assert report.render_table(report.table_rows(results)) in res.stdout
    assert "loopback TCP" in res.stdout and "times are CPU" in res.stdout
    ring = results["contention"]["runs"]["2"]["ring"]
    assert ring["seconds"] == ring["times"][0] and "busiest_bytes" not in ring
    for png in ("step_times.png", "accuracy.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    flat = " ".join(res.stdout.split())
    assert all(" ".join(line.split()) in flat for line in report.rule(results["predict"]))


@pytest.mark.timeout(120)
def test_contention_on_namespace_hosts(tmp_path) -> None:
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import nethosts
    finally:
        sys.path.remove(str(REPO / "tools"))
    reason = nethosts.available()
    if reason:
        pytest.skip(reason)
    sys.path.insert(0, str(EXAMPLE))
    try:
        import contention
    finally:
        sys.path.remove(str(EXAMPLE))
    count = 1 << 20  # 4 MiB per step at 1 Gbit/s: ~35 ms
    got = contention.measure([2], reps=2, count=count, log=lambda _: None)
    assert got["network"] == "namespaces" and 0.8e9 < got["link_bps"] < 1e9
    runs = got["runs"]["2"]
    n = 4 * count
    # bytes on each host's link, by the kernel's counters: ring 2 (W-1)/W n = n each way
    # on every worker; one server takes W n in and sends W n out; 2 servers n each
    for phase, busiest in (("ring", n), ("ps1", 2 * n), ("psW", n)):
        assert busiest <= runs[phase]["busiest_bytes"] < 1.1 * busiest, phase
    assert runs["ps1"]["busiest_host"] == 2  # the server, on the host after the workers
    assert runs["ps1"]["seconds"] > 1.5 * runs["ring"]["seconds"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flag", ["--gloo", None])
def test_torch_basics_under_both_imports(flag: str | None) -> None:
    script = REPO / "examples" / "torch_basics.py"
    # 2 ranks: the example's two calls under each import need no more, and every rank is a
    # torch start (seconds of CPU); odd sizes are covered by tests/torch and tests/api
    cmd = [sys.executable, "-m", "pycollective", "run", "-n", "2", sys.executable, str(script)]
    res = subprocess.run(cmd + ([flag] if flag else []), cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=110)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in range(2):
        assert f"rank {rank}: broadcast from rank 0 gave 123.0" in res.stdout
        assert f"rank {rank}: all_reduce of the ranks 0..1 gave 1.0" in res.stdout


def test_a_mode_is_one_registration(tmp_path) -> None:
    """The elastic mode to come: one registered function, with its own report hooks."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        import demo
    finally:
        sys.path.remove(str(EXAMPLE))
    assert list(demo.MODES) == ["accuracy", "contention", "predict", "elastic"]

    @demo.mode("fake", "a mode added by a test", text=lambda res: [f"fake: {res['fake']['n']}"])
    def fake(ctx):
        return {"n": len(ctx.results)}

    try:
        assert demo.parse(["--modes", "predict,fake"]).modes == "predict,fake"
        text = demo.render({"config": {"model": "large"}, "fake": {"n": 7}}, tmp_path)
        assert "fake: 7" in text
    finally:
        del demo.MODES["fake"]
    with pytest.raises(SystemExit):
        demo.parse(["--modes", "nonsense"])
