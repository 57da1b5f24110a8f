"""pycollective._files, the private files every other module writes and trusts: directories
made 0700 and judged like ssh judges ~/.ssh, atomic private writes that replace a planted
link instead of following it, create-once files with exactly one winner, and reads that
refuse links, other users' files and files open to others.

The tests run as root: a file chown'ed to uid 65534 (nobody) plays another user's."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat

import pytest

from pycollective import _files
from pycollective._errors import UsageError
from pycollective._files import UnsafePath

NOBODY = 65534


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def open_umask():
    """A umask of 0: whatever a file or directory gets, it got from the library."""
    old = os.umask(0)
    yield
    os.umask(old)


# ---------------------------------------------------------------------- private_dir


def test_private_dir_makes_a_missing_directory_0700_with_its_parents(tmp_path, open_umask) -> None:
    target = tmp_path / "a" / "b" / "flight"
    assert _files.private_dir(target) == str(target)
    assert _mode(target) == 0o700
    assert _files.private_dir(target) == str(target)  # again: it is ours and private


def test_private_dir_refuses_a_link_to_a_directory(tmp_path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(UnsafePath, match="symbolic link"):
        _files.private_dir(link)
    with pytest.raises(UnsafePath, match="symbolic link"):
        _files.private_dir(link, create=False)


def test_private_dir_refuses_another_users_directory(tmp_path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match=f"owned by uid {NOBODY}") as info:
        _files.private_dir(theirs)
    assert "choose another path" in str(info.value)
    assert isinstance(info.value, UsageError)


@pytest.mark.parametrize(
    "mode, said",
    [
        (0o755, "mode 0755: readable and executable by group, readable and executable by others"),
        (0o770, "mode 0770: readable and writable and executable by group"),
        (0o1777, "mode 1777: readable and writable and executable by group"),
        (0o701, "mode 0701: executable by others"),
    ],
)
def test_private_dir_refuses_a_directory_open_to_others_and_says_the_fix(
    tmp_path, mode, said
) -> None:
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, mode)
    with pytest.raises(UnsafePath) as info:
        _files.private_dir(d)
    assert said in str(info.value) and f"chmod 700 {d}" in str(info.value)


def test_private_dir_refuses_a_file_and_a_missing_one_when_not_creating(tmp_path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    os.chmod(f, 0o600)
    with pytest.raises(UnsafePath, match="not a directory"):
        _files.private_dir(f)
    with pytest.raises(FileNotFoundError):
        _files.private_dir(tmp_path / "missing", create=False)


def test_ensure_dir_makes_a_missing_one_0700_and_leaves_an_existing_one_be(
    tmp_path, open_umask
) -> None:
    new = tmp_path / "x" / "y"
    _files.ensure_dir(new)
    assert _mode(new) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o775)
    _files.ensure_dir(shared)
    assert _mode(shared) == 0o775


# ---------------------------------------------------------------------- write_private


def test_write_private_writes_0600_whatever_the_umask(tmp_path, open_umask) -> None:
    path = tmp_path / "out.json"
    _files.write_private(path, "hello")
    assert path.read_text() == "hello" and _mode(path) == 0o600
    os.chmod(path, 0o644)
    _files.write_private(path, b"again")  # replaces, and the new file is private again
    assert path.read_bytes() == b"again" and _mode(path) == 0o600
    assert os.listdir(tmp_path) == ["out.json"]  # no temporary file left


def test_write_private_replaces_a_planted_link_instead_of_following_it(tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    planted = tmp_path / "out.json"
    planted.symlink_to(victim)
    _files.write_private(planted, "ours")
    assert victim.read_text() == "precious"
    assert not planted.is_symlink() and planted.read_text() == "ours"


def test_replacing_leaves_the_old_file_on_an_exception(tmp_path) -> None:
    path = tmp_path / "f"
    path.write_text("old")
    with pytest.raises(RuntimeError), _files.replacing(path) as f:
        f.write("half")
        raise RuntimeError("while writing")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["f"]


# ---------------------------------------------------------------------- create_private


def test_create_private_creates_once(tmp_path, open_umask) -> None:
    path = tmp_path / "secret"
    assert _files.create_private(path, b"first") is True
    assert _mode(path) == 0o600
    assert _files.create_private(path, b"second") is False
    assert path.read_bytes() == b"first" and os.listdir(tmp_path) == ["secret"]


def test_create_private_never_writes_through_a_planted_link(tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "to-victim").symlink_to(victim)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert _files.create_private(tmp_path / "to-victim", b"ours") is False
    assert _files.create_private(tmp_path / "dangling", b"ours") is False
    assert victim.read_text() == "precious" and not (tmp_path / "nowhere").exists()


def _race(path: str, mine: bytes, start, out) -> None:
    start.wait()
    won = _files.create_private(path, mine)
    out.put((mine, won, _files.read_private(path, 1024)))


@pytest.mark.timeout(60)
def test_create_private_races_have_one_winner_whose_bytes_everyone_reads(tmp_path) -> None:
    ctx = mp.get_context("fork")
    for round_ in range(5):
        path = str(tmp_path / f"secret{round_}")
        n = 4
        start, out = ctx.Barrier(n), ctx.Queue()
        procs = [
            ctx.Process(target=_race, args=(path, b"proc%d" % i, start, out)) for i in range(n)
        ]
        for p in procs:
            p.start()
        results = [out.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(10)
            assert p.exitcode == 0
        winners = [mine for mine, won, _ in results if won]
        assert len(winners) == 1
        assert {read for _, _, read in results} == {winners[0]}
        assert sorted(os.listdir(tmp_path)) == [f"secret{r}" for r in range(round_ + 1)]


# ---------------------------------------------------------------------- read_private


def test_read_private_reads_a_private_file(tmp_path) -> None:
    path = tmp_path / "key"
    _files.write_private(path, b"k" * 10)
    assert _files.read_private(path, 10) == b"k" * 10
    with pytest.raises(UnsafePath, match="larger than the 9 bytes"):
        _files.read_private(path, 9)


def test_read_private_refuses_a_link_even_to_a_private_file(tmp_path) -> None:
    real = tmp_path / "real"
    _files.write_private(real, b"k")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(UnsafePath, match="symbolic link"):
        _files.read_private(link, 100)


def test_read_private_refuses_another_users_file(tmp_path) -> None:
    path = tmp_path / "key"
    _files.write_private(path, b"k")
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match=f"{path}: is owned by uid {NOBODY}"):
        _files.read_private(path, 100)


@pytest.mark.parametrize(
    "mode, said",
    [
        (0o644, "mode 0644: readable by group, readable by others"),
        (0o620, "mode 0620: writable by group"),
        (0o604, "mode 0604: readable by others"),
    ],
)
def test_read_private_refuses_a_file_open_to_others_like_ssh(tmp_path, mode, said) -> None:
    path = tmp_path / "key"
    _files.write_private(path, b"k")
    os.chmod(path, mode)
    with pytest.raises(UnsafePath) as info:
        _files.read_private(path, 100)
    assert str(info.value) == f"{path}: {said}; make it private: chmod 600 {path}"


@pytest.mark.timeout(10)
def test_read_private_refuses_a_fifo_and_a_directory_without_hanging(tmp_path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)  # opening it for reading would block until a writer came
    with pytest.raises(UnsafePath, match="not a file"):
        _files.read_private(fifo, 100)
    d = tmp_path / "dir"
    d.mkdir(mode=0o700)
    with pytest.raises(UnsafePath, match="not a file"):
        _files.read_private(d, 100)


def test_open_private_creates_0600_and_refuses_what_read_private_refuses(
    tmp_path, open_umask
) -> None:
    path = tmp_path / "store"
    fd = _files.open_private(path, os.O_RDWR | os.O_CREAT)
    os.close(fd)
    assert _mode(path) == 0o600
    os.chmod(path, 0o666)
    with pytest.raises(UnsafePath, match="writable by others"):
        _files.open_private(path, os.O_RDWR | os.O_CREAT)
