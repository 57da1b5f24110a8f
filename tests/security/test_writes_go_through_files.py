"""Every file the library writes goes through pycollective._files (issue 18: "every file the
library writes is private"), checked on the source: no `open(..., "w")`, no `os.open`,
no mkdir or temporary files, no `write_text`/`savefig(path)`/`os.replace` of its own
anywhere else, except the few places listed below with the reason they are safe.

The attacks in test_file_attacks.py prove the paths we know about; this keeps the next
one from being written the old way. Sans-IO: the source is parsed with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "pycollective"

# (file under src/pycollective, the call) -> why it is safe
ALLOWED: dict[tuple[str, str], str] = {
    ("_files.py", "os.open"): "the module every other write goes through",
    ("_files.py", "os.mkdir"): "the module every other write goes through",
    ("_files.py", "os.makedirs"): "the module every other write goes through",
    ("_files.py", "os.replace"): "the module every other write goes through",
    ("_files.py", "os.link"): "the module every other write goes through",
    ("shm/arena.py", "os.open"): "segments: O_CREAT|O_EXCL 0600 random names; attach O_RDWR",
    ("shm/shared.py", "os.open"): "maps a peer's memfd through /proc/<pid>/fd, inode checked",
    ("_load.py", "os.open"): "reads /proc/loadavg, O_RDONLY: writes nothing",
    ("cli/run/launch.py", "tempfile.mkdtemp"): "a fresh 0700 directory with a random name",
    ("cli/calibrate.py", "tempfile.TemporaryFile"): "anonymous: 0600 and never has a name",
    ("observe/flight.py", "tempfile.mkdtemp"): "a fresh 0700 directory with a random name",
    ("_tls.py", "tempfile.mkdtemp"): "a fresh 0700 directory for one ssl call, removed at once",
}

_CALLS = {
    "os.open", "os.mkdir", "os.makedirs", "os.replace", "os.rename", "os.link", "os.symlink",
    "tempfile.mkstemp", "tempfile.mkdtemp", "tempfile.NamedTemporaryFile",
    "tempfile.TemporaryFile", "shutil.copy", "shutil.copyfile", "shutil.copy2",
    "shutil.move",
}  # fmt: skip
_METHODS = {"write_text", "write_bytes", "mkdir", "touch", "savefig", "symlink_to"}


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return ""


def _writes(call: ast.Call) -> str | None:
    """The name of the write this call makes, or None when it writes nothing."""
    name = _name(call.func)
    if name in ("open", "io.open"):
        mode = call.args[1] if len(call.args) > 1 else None
        for kw in call.keywords:
            if kw.arg == "mode":
                mode = kw.value
        if mode is None:
            return None
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
            return "open" if set(mode.value) & set("wax+") else None
        return "open"  # a mode we cannot read: judge it as a write
    if name in _CALLS:
        return name
    if isinstance(call.func, ast.Attribute) and call.func.attr in _METHODS:
        if call.func.attr == "savefig" and call.args and _is_file_object(call.args[0]):
            return None
        return f".{call.func.attr}"
    return None


def _is_file_object(arg: ast.expr) -> bool:
    return isinstance(arg, ast.Name) and arg.id == "f"  # `with _files.replacing(...) as f`


def test_every_write_goes_through_files() -> None:
    found, used = [], set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                what = _writes(node)
                if what is None:
                    continue
                if (rel, what) in ALLOWED:
                    used.add((rel, what))
                else:
                    found.append(f"{rel}:{node.lineno}: {what}")
    assert not found, (
        "files written without pycollective._files (private_dir, replacing, write_private, "
        "create_private, open_private), or list the call in ALLOWED with why it is safe:\n"
        + "\n".join(found)
    )
    assert used == set(ALLOWED), f"ALLOWED lists calls no longer made: {set(ALLOWED) - used}"


def test_the_check_sees_the_old_ways(tmp_path) -> None:
    """The scanner itself, on the patterns the library used before it had _files."""
    src = """
import json, os, tempfile
def dump(tmp, path, data, fig):
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)
    os.makedirs("d", exist_ok=True)
    fd, name = tempfile.mkstemp()
    fig.savefig(path)
    with open(path) as f:  # a read: fine
        f.read()
    fig.savefig(f)  # into a file object _files opened: fine
"""
    calls = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call)]
    assert sorted(w for w in map(_writes, calls) if w) == sorted(
        ["open", "os.replace", "os.makedirs", "tempfile.mkstemp", ".savefig"]
    )
