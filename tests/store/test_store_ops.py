"""The Store contract, run against every store kind (hash, tcp, file, prefix over tcp)."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
from tests._threads import run_in_threads

from pycollective import _errors
from pycollective.store import StoreError

pytestmark = pytest.mark.timeout(20)


def test_set_get_roundtrip(make_store):
    s = make_store()
    s.set("a", "text")
    s.set("b", b"\x00\xffbin")
    s.set("empty", b"")
    s.set("ünï", "v")
    assert s.get("a") == b"text"
    assert s.get("b") == b"\x00\xffbin"
    assert s.get("empty") == b""
    assert s.get("ünï") == b"v"
    s.set("a", "replaced")
    assert s.get("a") == b"replaced"


def test_add_is_a_decimal_counter(make_store):
    s = make_store()
    assert s.add("c", 5) == 5
    assert s.add("c", -7) == -2
    assert s.get("c") == b"-2"
    s.set("n", "40")
    assert s.add("n", 2) == 42


def test_add_on_non_integer_raises(make_store):
    s = make_store()
    s.set("x", "abc")
    with pytest.raises(StoreError, match="not an integer"):
        s.add("x", 1)
    assert s.get("x") == b"abc"


def test_compare_set_follows_torch(make_store):
    s = make_store()
    assert s.compare_set("missing", "nope", "v") == b"nope"  # missing, expected not empty
    assert not s.check(["missing"])
    assert s.compare_set("k", "", "first") == b"first"  # missing, expected empty: set
    assert s.compare_set("k", "wrong", "second") == b"first"
    assert s.compare_set("k", "first", "second") == b"second"
    assert s.get("k") == b"second"


def test_check_delete_num_keys(make_store):
    s = make_store()
    assert s.num_keys() == 0
    assert s.check([])
    s.set("a", "1")
    s.add("b", 1)
    assert s.check(["a", "b"])
    assert not s.check(["a", "zzz"])
    assert s.num_keys() == 2
    assert s.delete_key("a") is True
    assert s.delete_key("a") is False
    assert not s.check(["a"])
    assert s.num_keys() == 1


def test_get_blocks_until_a_later_set(make_store):
    reader, writer = make_store(), make_store()
    timer = threading.Timer(0.2, writer.set, args=("late", "here"))
    timer.start()
    t0 = time.monotonic()
    assert reader.get("late", timeout=5) == b"here"
    assert 0.15 < time.monotonic() - t0 < 3
    # the reader can have its answer before the writer has its own: the store must not
    # be closed under the writer (it would fail in its thread, named in a later test)
    timer.join(5)


def test_wait_released_by_set_and_add(make_store):
    reader, writer = make_store(), make_store()

    def later() -> None:
        time.sleep(0.1)
        writer.set("x", "1")
        time.sleep(0.1)
        writer.add("y", 1)

    writes = threading.Thread(target=later)
    writes.start()
    reader.wait(["x", "y"], timeout=5)
    assert reader.check(["x", "y"])
    writes.join(5)


def test_get_timeout_names_key_and_time(make_store):
    s = make_store()
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=r"0\.3 s.*'(job/)?nothing'"):
        s.get("nothing", timeout=0.3)
    assert 0.25 < time.monotonic() - t0 < 3
    assert isinstance(StoreError("x"), _errors.CollectiveError)


def test_wait_timeout_names_missing_keys(make_store):
    s = make_store()
    s.set("here", "1")
    with pytest.raises(StoreError, match=r"still missing: \['(job/)?gone'\]"):
        s.wait(["here", "gone"], timeout=datetime.timedelta(milliseconds=200))


def test_default_timeout_from_construction(make_store):
    s = make_store(timeout=0.2)
    assert s.timeout == pytest.approx(0.2)
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="0.2 s"):
        s.get("never")
    assert time.monotonic() - t0 < 3


def test_threads_share_one_store(make_store):
    s = make_store()

    def work(i: int) -> None:
        for _ in range(25):
            s.add("counter", 1)
        s.set(f"t{i}", str(i))

    run_in_threads(work, 8, 60)
    assert s.get("counter") == b"200"
    s.wait([f"t{i}" for i in range(8)], timeout=5)


def test_bad_arguments_are_usage_errors(make_store):
    s = make_store()
    with pytest.raises(_errors.UsageError):
        s.set(b"bytes-key", "v")  # type: ignore[arg-type]
    with pytest.raises(_errors.UsageError):
        s.wait("abc")  # a str, not a list of keys
    with pytest.raises(_errors.UsageError):
        s.set("k", 12)  # type: ignore[arg-type]
    with pytest.raises(_errors.UsageError):
        s.get("k", timeout=-1)
