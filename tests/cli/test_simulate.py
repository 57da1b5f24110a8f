"""`pycollective simulate`: predictions from the cost model, units, and bad input."""

from __future__ import annotations

import argparse
import json

import pytest

from pycollective.__main__ import main
from pycollective.cli.simulate import parse_bytes, parse_per_byte, parse_time
from pycollective.schedule import cost
from pycollective.schedule import topology as T


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["simulate", *argv])
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_rows_match_the_cost_models(capsys):
    code, out, _ = run(
        capsys,
        "--algorithm",
        "ring,halving_doubling,hierarchical",
        "--ranks",
        "8,64",
        "--bytes",
        "1MiB,64MiB",
        "--alpha",
        "20us",
        "--beta",
        "10Gbit/s",
        "--gamma",
        "0.1ns/B",
        "--ranks-per-host",
        "4",
        "--json",
    )
    assert code == 0
    rows = json.loads(out)
    assert len(rows) == 3 * 2 * 2
    intra = cost.CostParams(alpha=2e-6, beta=1e-10, gamma=1e-10)
    inter = cost.CostParams(alpha=20e-6, beta=0.8e-9, gamma=1e-10)
    for r in rows:
        topo = T.Topology(r["ranks"] // 4, 4, intra, inter)
        want = T.predict(r["algorithm"], r["nbytes"] // 4, 4, topo)
        assert r["seconds"] == pytest.approx(want)
        assert r["hosts"] * r["ranks_per_host"] == r["ranks"]
        p = r["ranks"]
        assert r["algbw"] == pytest.approx(r["nbytes"] / r["seconds"] / 1e9)
        assert r["busbw"] == pytest.approx(r["algbw"] * 2 * (p - 1) / p)


def test_one_level_model_without_a_layout(capsys):
    code, out, _ = run(
        capsys,
        "--collective",
        "all_gather",
        "--ranks",
        "4,16",
        "--bytes",
        "4MiB",
        "--beta",
        "0.5ns/B",
        "--alpha",
        "1ms",
        "--json",
    )
    assert code == 0
    rows = json.loads(out)
    assert {r["algorithm"] for r in rows} == {"ring", "bruck"}
    params = cost.CostParams(alpha=1e-3, beta=0.5e-9, gamma=0.12e-9)
    for r in rows:
        count = (4 << 20) // 4 // r["ranks"]  # per-block count: the gathered size / p
        want = cost.predict("all_gather", r["algorithm"], r["ranks"], count, 4, params)
        assert r["seconds"] == pytest.approx(want)
        assert r["ranks_per_host"] == 1


def test_table_at_4096_ranks(capsys):
    code, out, _ = run(capsys, "-a", "ring,hierarchical", "-n", "1024,4096", "-r", "8")
    assert code == 0
    lines = out.splitlines()
    assert "8 ranks per host" in lines[0]
    assert len(lines) == 2 + 4
    assert any("4096" in ln and "hierarchical" in ln and "*" in ln for ln in lines)


def test_markdown(capsys):
    code, out, _ = run(capsys, "-a", "ring", "-n", "8", "--markdown", "--hosts", "2")
    assert code == 0
    assert "| 64 MiB | 8 | 2 x 4 | ring |" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["-a", "ring,bogus"], "unknown algorithm 'bogus' for all_reduce"),
        (["-a", "hierarchical"], "hierarchical needs a layout"),
        (["--collective", "broadcast", "-a", "hierarchical", "-r", "2"], "unknown algorithm"),
        (["-n", "12", "-r", "8"], "12 ranks do not fill hosts of --ranks-per-host 8"),
        (["-n", "12", "--hosts", "5"], "do not split evenly"),
    ],
)
def test_bad_combinations(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert message in err


@pytest.mark.parametrize(
    "args,message",
    [
        (["--alpha", "fast"], "not a time: 'fast'"),
        (["--beta", "10 parsecs"], "not a rate"),
        (["--bytes", "64XB"], "not a size"),
        (["--ranks", "0"], "must be >= 1"),
        (["--ranks", ","], "empty list"),
        (["--hosts", "2", "--ranks-per-host", "4"], "not allowed with"),
        (["--collective", "gossip"], "invalid choice"),
    ],
)
def test_bad_values(capsys, args, message):
    code, _, err = run(capsys, *args)
    assert code == 2
    assert message in err


def test_units():
    assert parse_time("20us") == pytest.approx(20e-6)
    assert parse_time("1.5ms") == pytest.approx(1.5e-3)
    assert parse_time("2e-5") == pytest.approx(2e-5)
    assert parse_per_byte("10Gbit/s") == pytest.approx(0.8e-9)
    assert parse_per_byte("10Gbps") == pytest.approx(0.8e-9)
    assert parse_per_byte("100Gbit/s") == pytest.approx(0.08e-9)
    assert parse_per_byte("1.25GB/s") == pytest.approx(0.8e-9)
    assert parse_per_byte("1GiB/s") == pytest.approx(1 / 2**30)
    assert parse_per_byte("0.8ns/B") == pytest.approx(0.8e-9)
    assert parse_per_byte("8e-10") == pytest.approx(0.8e-9)
    assert parse_bytes("64MiB") == 64 << 20
    assert parse_bytes("64M") == 64 << 20
    assert parse_bytes("64MB") == 64 << 20  # one rule: binary (pycollective._units)
    assert parse_bytes("4096") == 4096
    for bad in ("1.5", "0.5B"):
        with pytest.raises(argparse.ArgumentTypeError, match="whole number"):
            parse_bytes(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="> 0"):
        parse_per_byte("0Gbit/s")


def test_wide_table(capsys):
    code, out, _ = run(
        capsys, "-a", "ring,hierarchical", "-n", "8,64", "-r", "8", "--wide", "--markdown"
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[1] == "| size | ranks | hosts x per host | ring | hierarchical |"
    assert lines[3].startswith("| 64 MiB | 8 | 1 x 8 |")
    assert lines[4].startswith("| 64 MiB | 64 | 8 x 8 |") and lines[4].count("*") == 1


def test_parameter_server_rows(capsys):
    code, out, _ = run(capsys, "-a", "ring", "-n", "4,64", "--bytes", "30000000",
                       "--alpha", "200us", "--beta", "1Gbit/s", "--overhead", "100us",
                       "--servers", "1,8", "--json")  # fmt: skip
    assert code == 0
    rows = json.loads(out)
    assert [(r["algorithm"], r["ranks"], r["servers"]) for r in rows] == [
        ("ring", 4, 0), ("parameter_server", 4, 1), ("parameter_server", 4, 8),
        ("ring", 64, 0), ("parameter_server", 64, 1), ("parameter_server", 64, 8),
    ]  # fmt: skip
    from pycollective.schedule import parameter_server as ps

    params = cost.CostParams(alpha=200e-6, beta=8e-9, gamma=0.12e-9, overhead=100e-6)
    for r in rows[1:3] + rows[4:]:
        assert r["hosts"] == r["ranks"] + r["servers"]
        want = cost.schedule_cost(ps.sample(r["ranks"], r["servers"], 30_000_000 // 4), 4, params)
        assert r["seconds"] == pytest.approx(want)
    # one server's link carries W x n each way: 4 workers take 4x as long as 8 servers
    assert rows[1]["seconds"] == pytest.approx(4 * rows[2]["seconds"], rel=0.01)
    code, out, _ = run(capsys, "-a", "ring", "-n", "8", "--servers", "2", "--wide")
    assert code == 0 and "parameter_server x2" in out
    code, _, err = run(capsys, "-n", "8", "--servers", "2", "-r", "4")
    assert code == 2 and "one worker per host" in err
