"""Attacks on the files the library writes (issue 18, finding 4 and "every file the library
writes is private"): a symbolic link planted at every path the library writes (a
temporary name included) must leave the victim's file intact; a predictable directory
pre-created by another user, or open to others, must not be used; what is written is 0600.

Paths: flight-recorder dumps (observe/flight.py), timeline files and their merge
(observe/timeline.py), the calibration cache (tuning/cache.py), and the files the
subcommands write (timeline merge -o, bench --json/--plot, calibrate --json).

The tests run as root: chown to uid 65534 (nobody) plays "another user". In-process, no
job: each attack takes milliseconds."""

from __future__ import annotations

import json
import os
import stat
import tempfile
import warnings

import pytest

from pycollective.observe import flight as _flight
from pycollective.observe import timeline as _timeline
from pycollective.schedule.cost import CostParams
from pycollective.tuning import cache as _costcache
from pycollective.tuning import params as _tuning

NOBODY = 65534
PRECIOUS = "the victim's file\n"


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def victim(tmp_path):
    """A file of the victim's that a planted link points at."""
    path = tmp_path / "victim" / "precious.txt"
    path.parent.mkdir()
    path.write_text(PRECIOUS)
    return path


@pytest.fixture
def usual_umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


# ---------------------------------------------------------------------- flight recorder


def _recorder(rank: int = 0) -> _flight.FlightRecorder:
    rec = _flight.FlightRecorder(rank=rank, size=2, capacity=4)
    rec.record(1, "g", 0, "all_reduce", 4, None, "ring").start()
    return rec


@pytest.fixture
def default_flight_dir(tmp_path, monkeypatch):
    """flight_dir()'s predictable default, moved into this test's own temporary dir."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o1777)
    os.chmod(tmp, 0o1777)  # like /tmp: everyone may create names here
    monkeypatch.delenv("PYCOLLECTIVE_FLIGHT_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp / f"pycollective-flight-{os.getuid()}"


def test_flight_dump_through_planted_links_leaves_the_victim_intact(
    default_flight_dir, victim, usual_umask
) -> None:
    """Finding 4: a link planted at the dump's name and at its old temporary name
    (predictable: rank<R>-<pid>.json.tmp) is replaced, never written through."""
    default_flight_dir.mkdir(mode=0o700)
    name = f"rank0-{os.getpid()}.json"
    (default_flight_dir / name).symlink_to(victim)
    (default_flight_dir / f"{name}.tmp").symlink_to(victim)
    path = _recorder().dump("attack")
    assert path == str(default_flight_dir / name)
    assert victim.read_text() == PRECIOUS
    assert not os.path.islink(path) and json.loads(open(path).read())["reason"] == "attack"
    assert _mode(path) == 0o600  # was 0644: dumps name the job's calls


def test_flight_default_dir_is_made_0700(default_flight_dir, usual_umask) -> None:
    path = _recorder().dump("x")
    assert os.path.dirname(path) == str(default_flight_dir)
    assert _mode(default_flight_dir) == 0o700 and _mode(path) == 0o600


@pytest.mark.parametrize(
    "attack", ["another user's", "world-writable", "group-writable", "a link to theirs"]
)
def test_flight_refuses_a_predictable_dir_it_cannot_trust(
    default_flight_dir, tmp_path, attack
) -> None:
    """Finding 4: `makedirs(exist_ok=True)` took whatever was at the predictable name. A
    directory pre-created by another user (who could then read or swap the dumps), one open
    to others, or a link are refused with a warning; the dump goes to a fresh private
    directory, named in the warning, and nothing lands in the attacker's."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    if attack == "another user's":
        os.chmod(theirs, 0o777)
        os.chown(theirs, NOBODY, NOBODY)
        theirs.rename(default_flight_dir)
        theirs = default_flight_dir
    elif attack == "world-writable":
        os.chmod(theirs, 0o777)
        theirs.rename(default_flight_dir)
        theirs = default_flight_dir
    elif attack == "group-writable":
        os.chmod(theirs, 0o770)
        theirs.rename(default_flight_dir)
        theirs = default_flight_dir
    else:
        os.chmod(theirs, 0o700)
        os.chown(theirs, NOBODY, NOBODY)
        default_flight_dir.symlink_to(theirs)
    rec = _recorder()
    with pytest.warns(UserWarning, match=f"not using {default_flight_dir}") as said:
        path = rec.dump("attack")
    assert path is not None and os.listdir(theirs) == []
    fresh = os.path.dirname(path)
    assert fresh != str(default_flight_dir) and _mode(fresh) == 0o700 and _mode(path) == 0o600
    assert f"dumps to {fresh} instead" in str(said[0].message)
    # ... and the next dump of this recorder goes to the same fresh directory, unsaid.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = rec.dump("again")
    assert os.path.dirname(again) == fresh


def test_flight_explicit_dir_is_made_private_and_written_safely(
    tmp_path, monkeypatch, victim, usual_umask
) -> None:
    """PYCOLLECTIVE_FLIGHT_DIR: a missing one is made 0700; an existing shared one the user
    chose is used, but nothing in it is followed."""
    new = tmp_path / "new" / "dumps"
    monkeypatch.setenv("PYCOLLECTIVE_FLIGHT_DIR", str(new))
    path = _recorder().dump("x")
    assert os.path.dirname(path) == str(new) and _mode(new) == 0o700 and _mode(path) == 0o600
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    name = f"rank1-{os.getpid()}.json"
    (shared / name).symlink_to(victim)
    (shared / f"{name}.tmp").symlink_to(victim)
    monkeypatch.setenv("PYCOLLECTIVE_FLIGHT_DIR", str(shared))
    path = _recorder(rank=1).dump("x")
    assert path == str(shared / name) and victim.read_text() == PRECIOUS
    assert _mode(path) == 0o600


# ---------------------------------------------------------------------- timeline


def _timeline_of(template: str, rank: int = 0) -> _timeline.Timeline:
    tl = _timeline.Timeline(template, rank, 2)
    e = tl.entry()
    e.kind, e.count, e.t_issued = "all_reduce", 4, 1.0
    e.start()
    e.end()
    return tl


def test_timeline_write_through_planted_links_leaves_the_victim_intact(
    tmp_path, victim, usual_umask
) -> None:
    """PYCOLLECTIVE_TIMELINE=/shared/trace.json: links planted at the rank file and at its
    old temporary name (trace.rank0.json.tmp<pid>) are replaced, not followed."""
    template = str(tmp_path / "trace.json")
    rank_file = tmp_path / "trace.rank0.json"
    rank_file.symlink_to(victim)
    (tmp_path / f"trace.rank0.json.tmp{os.getpid()}").symlink_to(victim)
    assert _timeline_of(template).write() == str(rank_file)
    assert victim.read_text() == PRECIOUS
    assert not rank_file.is_symlink() and _mode(rank_file) == 0o600
    assert json.loads(rank_file.read_text())["otherData"]["rank"] == 0


def test_timeline_merge_through_planted_links_leaves_the_victim_intact(
    tmp_path, victim, usual_umask
) -> None:
    template = str(tmp_path / "trace.json")
    for rank in (0, 1):
        _timeline_of(template, rank).write()
    merged = tmp_path / "trace.json"
    merged.symlink_to(victim)
    (tmp_path / f"trace.json.tmp{os.getpid()}").symlink_to(victim)
    assert _timeline.write_merged(template) == template
    assert victim.read_text() == PRECIOUS
    assert not merged.is_symlink() and _mode(merged) == 0o600
    assert json.loads(merged.read_text())["otherData"]["ranks"] == [0, 1]


def test_timeline_missing_directory_is_made_0700(tmp_path, usual_umask) -> None:
    template = str(tmp_path / "traces" / "t.json")
    path = _timeline_of(template).write()
    assert _mode(tmp_path / "traces") == 0o700 and _mode(path) == 0o600


# ---------------------------------------------------------------------- calibration cache

MEASURED = CostParams(alpha=123e-6, beta=0.7e-9, gamma=0.2e-9)
INJECTED = {"alpha": 1.0, "beta": 1.0, "gamma": 1.0}  # makes every algorithm look awful


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_COST_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PYCOLLECTIVE_COST_TCP", raising=False)
    _tuning.reload()
    yield tmp_path / "cache"
    _tuning.reload()


def _plant_cache(directory, mode: int = 0o600, owner: int | None = None) -> str:
    path = _costcache.cache_path("tcp")
    assert path is not None and os.path.dirname(path) == str(directory)
    data = {"format": _costcache.FORMAT, "transport": "tcp", "params": INJECTED}
    with open(path, "w") as f:
        json.dump(data, f)
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner, owner)
    return str(path)


def test_cache_in_another_users_directory_is_neither_read_nor_written(cache) -> None:
    """A cache directory and entry pre-created by another user inject cost parameters
    (every job's choice of algorithm): the entry is ignored with a warning, and save
    refuses to write there."""
    cache.mkdir(mode=0o700)
    path = _plant_cache(cache, owner=NOBODY)
    os.chown(cache, NOBODY, NOBODY)
    with pytest.warns(UserWarning, match=f"owned by uid {NOBODY}"):
        assert _costcache.load("tcp") is None
    with pytest.warns(UserWarning, match=f"owned by uid {NOBODY}"):
        assert _costcache.save("tcp", MEASURED) is None
    assert json.loads(open(path).read())["params"] == INJECTED


@pytest.mark.parametrize("mode", [0o666, 0o644], ids=oct)
def test_cache_entry_open_to_others_is_ignored(cache, mode) -> None:
    cache.mkdir(mode=0o700)
    _plant_cache(cache, mode=mode)
    with pytest.warns(UserWarning, match=f"chmod 600 {cache}"):
        assert _costcache.load("tcp") is None


def test_cache_entry_that_is_a_link_is_not_followed(cache, tmp_path) -> None:
    cache.mkdir(mode=0o700)
    real = _plant_cache(cache)
    elsewhere = tmp_path / "elsewhere.json"
    os.rename(real, elsewhere)
    os.symlink(elsewhere, real)
    with pytest.warns(UserWarning, match="symbolic link"):
        assert _costcache.load("tcp") is None


def test_cache_save_through_planted_links_and_into_a_world_writable_dir(
    cache, victim, usual_umask
) -> None:
    cache.mkdir()
    os.chmod(cache, 0o777)
    with pytest.warns(UserWarning, match=f"mode 0777.*chmod 700 {cache}"):
        assert _costcache.save("tcp", MEASURED) is None
    os.chmod(cache, 0o700)
    path = _costcache.cache_path("tcp")
    os.symlink(victim, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _costcache.save("tcp", MEASURED) == path
    assert victim.read_text() == PRECIOUS and not path.is_symlink() and _mode(path) == 0o600
    assert _costcache.load("tcp") == MEASURED


def test_cache_dir_is_made_0700(cache, usual_umask) -> None:
    assert _costcache.save("tcp", MEASURED) is not None
    assert _mode(cache) == 0o700


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_cache_entry_with_a_non_finite_number_is_ignored(cache, value) -> None:
    """json.loads takes NaN and Infinity: a cost that is not a number would make every
    comparison of the model false."""
    cache.mkdir(mode=0o700)
    path = _costcache.cache_path("tcp")
    params = {"alpha": 1e-5, "beta": 1e-9, "gamma": 1e-10}
    text = json.dumps({"format": _costcache.FORMAT, "transport": "tcp", "params": params})
    path.write_text(text.replace("1e-05", value))
    os.chmod(path, 0o600)
    with pytest.warns(UserWarning, match="corrupt"):
        assert _costcache.load("tcp") is None


# ---------------------------------------------------------------------- subcommands' files


def test_timeline_merge_output_through_a_planted_link(tmp_path, victim, usual_umask) -> None:
    import argparse

    from pycollective.cli import timeline as cli_timeline

    for rank in (0, 1):
        _timeline_of(str(tmp_path / "t.json"), rank).write()
    out = tmp_path / "merged.json"
    out.symlink_to(victim)
    files = [str(tmp_path / "t.rank0.json"), str(tmp_path / "t.rank1.json")]
    parser = argparse.ArgumentParser()
    cli_timeline.add_arguments(parser)
    assert cli_timeline.main(parser.parse_args(["merge", *files, "-o", str(out)])) == 0
    assert victim.read_text() == PRECIOUS and not out.is_symlink() and _mode(out) == 0o600


def test_bench_plot_through_a_planted_link(tmp_path, victim, usual_umask) -> None:
    from pycollective.cli import bench

    record = {
        "collective": "all_reduce", "transport": "tcp", "algorithm": "ring", "ranks": 2,
        "bytes": 4, "time_us": 2.0, "min_us": 1.0, "max_us": 3.0, "busbw": 1.0, "algbw": 1.0,
    }  # fmt: skip
    plot = tmp_path / "bench.png"
    plot.symlink_to(victim)
    bench.plot([record, {**record, "bytes": 8}], str(plot))
    assert victim.read_text() == PRECIOUS and not plot.is_symlink() and _mode(plot) == 0o600
    assert plot.read_bytes().startswith(b"\x89PNG")
