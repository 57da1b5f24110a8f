"""`pycollective bench` as nccl-tests users read it: a tiny run end to end (its tables
parsed, JSON, plot), every bad argument a clean exit 2, optional dependencies checked
first, and the #wrong check itself against reference and broken collectives."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from tests._launch import REPO

from pycollective.__main__ import main
from pycollective.cli import bench
from pycollective.cli import bench_worker as bw
from pycollective.cli.bench_worker import BUS_FACTOR, per_rank_count


def test_sizes_and_factors() -> None:
    assert bench.parse_size("4") == 4
    assert bench.parse_size("64K") == 64 << 10
    assert bench.parse_size("256MiB") == 256 << 20
    assert bench.sizes(4, 256 << 20, 4)[:3] == [4, 16, 64]
    assert bench.sizes(4, 256 << 20, 4)[-1] == 256 << 20
    assert BUS_FACTOR["all_reduce"](4) == 1.5 and BUS_FACTOR["all_gather"](4) == 0.75
    assert BUS_FACTOR["broadcast"](8) == 1.0
    # nccl-tests sizes: the larger buffer; per-rank counts never 0
    assert per_rank_count("all_gather", 64, 2, 4) == 8
    assert per_rank_count("all_reduce", 64, 2, 4) == 16
    assert per_rank_count("reduce_scatter", 4, 4, 4) == 1


def parse_tables(text: str) -> dict[str, list[dict]]:
    """nccl-tests-style output -> {collective: [row, ...]} (each row: its columns)."""
    tables: dict[str, list[dict]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"# (\w+), (\d+) ranks$", line)
        if m:
            current = tables.setdefault(m.group(1), [])
            continue
        if current is None or line.startswith("#") or not line.strip():
            if line.startswith("# Out of bounds"):
                current = None
            continue
        f = line.split()
        row = dict(zip(["bytes", "human", "unit", "count", "type", "redop", "root",
                        "transport", "algorithm"], f[:9], strict=True))  # fmt: skip
        rest = f[9:]
        for mode in ("out_of_place", "in_place"):
            if rest[:1] == ["n/a"]:
                row[mode], rest = None, rest[1:]
            else:
                t, algbw, busbw, wrong = rest[:4]
                row[mode] = {"time": float(t), "algbw": float(algbw), "busbw": float(busbw),
                             "wrong": int(wrong)}  # fmt: skip
                rest = rest[4:]
        current.append(row)
    return tables


@pytest.mark.timeout(150)
def test_bench_runs_end_to_end(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    proc = subprocess.run(
        [sys.executable, "-m", "pycollective", "bench", "-n", "2", "-t", "shm,tcp",
         "-c", "all_reduce,broadcast,all_gather,reduce_scatter,all_to_all,barrier",
         "-a", "auto,ring", "-b", "4", "-e", "256", "-f", "64", "--reps", "3", "--min-reps", "2",
         "--budget", "0.05", "--json", str(out_json), "--plot", str(out_png)],
        cwd=REPO, capture_output=True, text=True, timeout=140,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "# broadcast: ring does not run broadcast (left out)" in out
    tables = parse_tables(out)
    assert list(tables) == ["all_reduce", "broadcast", "all_gather", "reduce_scatter",
                            "all_to_all", "barrier"]  # fmt: skip
    for coll, rows in tables.items():
        assert rows, coll
        for row in rows:
            modes = [m for m in ("out_of_place", "in_place") if row[m] is not None]
            assert modes == list(bw.MODES[coll]), (coll, row)
            for m in modes:
                assert row[m]["wrong"] == 0 and row[m]["time"] > 0, (coll, row)
            assert row["redop"] == ("sum" if coll in bw.REDUCING else "none")
            assert row["root"] == ("0" if coll == "broadcast" else "-1")
            assert row["type"] == "float32"
    algos = {(r["transport"], r["algorithm"]) for r in tables["all_reduce"]}
    assert ("shm", "auto:shm") in algos and ("tcp", "ring") in algos
    assert any(a.startswith("auto:") for t, a in algos if t == "tcp")
    assert [r["bytes"] for r in tables["all_reduce"] if r["algorithm"] == "ring"][:2] == [
        "4", "4"
    ] and tables["all_reduce"][0]["human"] == "4"  # fmt: skip
    assert re.search(r"^# Out of bounds values : 0 OK \(\d+ calls checked\)$", out, re.M)
    avg = re.findall(r"^# Avg bus bandwidth    : ([0-9.e+-]+) GB/s  (\w+) (\w+)$", out, re.M)
    assert {(t, a) for _, t, a in avg} == {("shm", "auto"), ("shm", "ring"), ("tcp", "auto"),
                                           ("tcp", "ring")}  # fmt: skip
    data = json.loads(out_json.read_text())
    for r in data["records"]:
        assert r["time_us"] > 0 and r["reps"] >= 2 and r["wrong"] == 0
        assert r["min_us"] <= r["time_us"] <= r["max_us"]
        if r["collective"] == "all_gather":
            assert r["in_place"]["wrong"] == r["out_of_place"]["wrong"] == 0
        if r["collective"] == "all_reduce":
            assert r["busbw"] == pytest.approx(r["algbw"] * 1.0)  # 2(p-1)/p at p=2
    assert out_png.stat().st_size > 1000


@pytest.mark.parametrize(
    "argv, says",
    [
        (["-a", "ring", "-c", "broadcast"], "no algorithm of ring runs broadcast; broadcast has"),
        (["-a", "telepathy"], "unknown algorithm telepathy"),
        (["-d", "float128"], "unknown dtype 'float128'; one of float16"),
        (["-o", "median"], "unknown op 'median'; one of sum, prod"),
        (["-c", "allreduce"], "unknown collective allreduce; one of all_reduce"),
        (["-t", "nccl"], "unknown transport nccl; one of shm, tcp, gloo"),
        (["-n", "0"], "-n/--nprocs must be >= 1"),
        (["-f", "1"], "-f/--factor must be >= 2"),
        (["-b", "1M", "-e", "1K"], "-b/--min-bytes (1 MiB) is larger than -e/--max-bytes"),
        (["--budget", "0"], "--budget must be > 0"),
    ],
)
def test_bad_arguments_exit_2_with_the_message(capsys, argv, says) -> None:
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pycollective bench: ") and says in err, err
    assert "Traceback" not in err


def test_bad_sizes_are_argparse_errors(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "-e", "lots"])
    assert info.value.code == 2
    assert "usage: pycollective bench" in capsys.readouterr().err


def test_optional_dependencies_are_checked_before_the_run(capsys, monkeypatch) -> None:
    real = bench.importlib.util.find_spec
    missing = {"matplotlib", "torch"}
    monkeypatch.setattr(
        bench.importlib.util, "find_spec", lambda name: None if name in missing else real(name)
    )
    assert main(["bench", "--plot", "x.png"]) == 2
    err = capsys.readouterr().err
    assert "--plot needs matplotlib" in err and "pip install 'pycollective[plot]'" in err
    assert main(["bench", "-t", "shm,gloo"]) == 2
    assert "pip install 'pycollective[torch]'" in capsys.readouterr().err


def test_help_shows_the_defaults(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default 2)", "(default float32)", "(default sum)", "(default 20)",
                    "(default 256M)", "(default shm,tcp)"):  # fmt: skip
        assert default in text, default


# --------------------------------------------------------------------- the #wrong check


class _Reference:
    """A rank of a p-rank job whose collectives compute the right answer by themselves
    from the known pattern of the other ranks (or, broken, leave the buffers alone)."""

    def __init__(self, rank: int, size: int, broken: bool = False) -> None:
        self.rank, self.size, self.broken = rank, size, broken

    empty = bw._Ours.empty
    view = bw._Ours.view
    block = bw._Ours.block

    def barrier(self) -> None:
        pass

    def invoke(self, collective, algorithm, op, *bufs):
        p, r = self.size, self.rank
        ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
                 "max": np.maximum}[op]  # fmt: skip

        def theirs(j: int, like: np.ndarray, offset: int = 0) -> np.ndarray:
            out = np.empty_like(like)
            bw.fill(out, offset, lambda i: bw._value(j, i))
            return out

        def reduced(like: np.ndarray, offset: int = 0) -> np.ndarray:
            acc = theirs(0, like, offset)
            with np.errstate(all="ignore"):
                for j in range(1, p):
                    ufunc(acc, theirs(j, like, offset), out=acc)
                if op == "avg":
                    acc = acc // p if acc.dtype.kind in "iu" else acc / p
            return acc.astype(like.dtype)

        def run() -> None:
            if self.broken:
                return
            if collective == "all_reduce" or (collective == "reduce" and r == 0):
                bufs[0][...] = reduced(bufs[0])
            elif collective == "broadcast":
                bufs[0][...] = theirs(0, bufs[0])
            elif collective == "all_gather":
                out, n = bufs[0], bufs[1].size
                for j in range(p):
                    out[j * n : (j + 1) * n] = theirs(j, bufs[1])
            elif collective == "reduce_scatter":
                out = bufs[0]
                out[...] = reduced(out, r * out.size)
            elif collective == "all_to_all":
                out, n = bufs[0], bufs[0].size // p
                for j in range(p):
                    out[j * n : (j + 1) * n] = theirs(j, out[:n], r * n)

        return run


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "uint16"])
@pytest.mark.parametrize("op", bw.OPS)
def test_the_check_passes_right_results_and_counts_wrong_ones(dtype, op) -> None:
    p, n = 3, 7  # n not a multiple of the pattern's period
    for collective in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter",
                       "all_to_all"):  # fmt: skip
        for rank in range(p):
            good = bw.make_modes(_Reference(rank, p), collective, "auto", n, dtype, op)
            assert {m: v.check() for m, v in good.items()} == dict.fromkeys(good, 0), (
                collective, rank)  # fmt: skip
            bad = bw.make_modes(_Reference(rank, p, broken=True), collective, "auto", n,
                                dtype, op)  # fmt: skip
            counts = {m: v.check() for m, v in bad.items()}
            if collective == "reduce" and rank != 0:
                assert set(counts.values()) == {0}  # only the root's result is defined
            elif collective == "broadcast" and rank == 0:
                assert set(counts.values()) == {0}  # the root already holds the answer
            else:
                assert all(c > 0 for c in counts.values()), (collective, rank, counts)
