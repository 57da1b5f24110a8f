"""FileStore across processes and instances; PrefixStore namespaces."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from pycollective.store import FileStore, HashStore, PrefixStore, StoreError

pytestmark = pytest.mark.timeout(30)


def test_filestore_across_processes(tmp_path):
    path = str(tmp_path / "rdzv")
    n = 3
    parent = FileStore(path, timeout=10)  # keeps the file alive for the whole job
    code = textwrap.dedent(
        """
        import sys
        from pycollective.store import FileStore
        path, rank, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
        s = FileStore(path, timeout=10)
        for _ in range(20):
            s.add("count", 1)
        s.set(f"rank{rank}", str(rank))
        s.wait([f"rank{r}" for r in range(n)])
        print(s.get("go").decode())
        s.close()
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, path, str(r), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(n)
    ]
    parent.wait([f"rank{r}" for r in range(n)])
    assert parent.get("count") == str(20 * n).encode()
    parent.set("go", "went")
    for p in procs:
        out, err = p.communicate(timeout=20)
        assert p.returncode == 0, err
        assert out.strip() == "went"
    assert parent.num_keys() == n + 2
    parent.close()
    assert not os.path.exists(path)  # the last user removes it


def test_filestore_instances_share_and_the_last_one_removes_the_file(tmp_path):
    path = tmp_path / "f"
    a = FileStore(path, timeout=5)
    b = FileStore(path, timeout=5)
    threading.Timer(0.1, a.set, args=("k", "v")).start()
    assert b.get("k") == b"v"
    assert b.delete_key("k")
    assert not a.check(["k"])
    a.close()
    a.close()  # idempotent
    assert path.exists()
    with pytest.raises(StoreError, match="closed"):
        a.get("k")
    b.close()
    assert not path.exists()
    # a new job on the same path starts empty
    c = FileStore(path, timeout=5)
    assert c.num_keys() == 0
    c.close()


def test_filestore_ignores_a_torn_tail(tmp_path):
    path = tmp_path / "f"
    a = FileStore(path, timeout=5)
    a.set("good", "1")
    with open(path, "ab") as f:
        f.write(b"S\x00\x00\x00\x05\x00\x00")  # a writer died mid-header
    b = FileStore(path, timeout=5)
    assert b.get("good") == b"1"
    b.set("after", "2")
    assert a.get("after") == b"2"
    a.close()
    b.close()


def test_filestore_bad_directory_is_a_store_error(tmp_path):
    with pytest.raises(StoreError, match="cannot open"):
        FileStore(tmp_path / "missing-dir" / "f")


def test_prefix_stores_are_isolated():
    base = HashStore(timeout=1)
    a, b = PrefixStore("a", base), PrefixStore("b", base)
    a.set("k", "from-a")
    b.set("k", "from-b")
    assert a.get("k") == b"from-a"
    assert b.get("k") == b"from-b"
    assert base.get("a/k") == b"from-a"
    assert a.add("n", 3) == 3 and b.add("n", 1) == 1
    assert a.check(["k", "n"]) and not a.check(["k", "other"])
    assert a.delete_key("k") and b.get("k") == b"from-b"
    with pytest.raises(StoreError, match="a/missing"):
        a.wait(["missing"], timeout=0.1)
    nested = PrefixStore("inner", a)
    nested.set("x", "1")
    assert base.get("a/inner/x") == b"1"
    assert a.timeout == 1
    a.set_timeout(2)
    assert base.timeout == 2
