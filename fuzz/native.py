"""The compiled core built for fuzzing: coverage for libFuzzer and AddressSanitizer.

    python -m fuzz.native [--out out/fuzz/native]   # prints the environment to run with

Builds, with clang, (1) pycollective._native from setup.py's own list of sources
(`setup.py build_ext` with CC=clang and -fsanitize=fuzzer-no-link,address, so the C
sources may move between files freely) into OUT/lib, and (2) OUT/asan_with_fuzzer.so:
clang's AddressSanitizer runtime and libFuzzer in one library (atheris's native-extension
mode), preloaded so that the extension's coverage counters and the fuzzer are one. Then
`python -m fuzz arena_words` with that environment loads the instrumented extension
(PYCOLLECTIVE_FUZZ_NATIVE). Rebuilt only when a C source or setup.py is newer.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = REPO / "src" / "pycollective" / "_native"
FLAGS = "-fsanitize=fuzzer-no-link,address -g -fno-omit-frame-pointer"


def _clang() -> str:
    clang = shutil.which(os.environ.get("CLANG", "clang"))
    if clang is None:
        raise SystemExit("the instrumented build needs clang (make system-deps installs it)")
    return clang


def _newest_input() -> float:
    files = [REPO / "setup.py", *SOURCES.rglob("*.[ch]")]
    return max(f.stat().st_mtime for f in files if f.exists())


def _archive(rt: Path, name: str) -> Path:
    """clang's static runtime `name`: clang 14 (Debian 12) names it by architecture,
    newer clangs keep it in a folder of the target without the suffix."""
    for path in (rt / f"libclang_rt.{name}-{platform.machine()}.a", rt / f"libclang_rt.{name}.a"):
        if path.exists():
            return path
    raise SystemExit(f"no {name} runtime in {rt} (Debian: apt-get install libclang-rt-dev)")


def _runtime(clang: str, out: Path) -> Path:
    """ASan's runtime and libFuzzer (without its main) as one preloadable library."""
    lib = out / "asan_with_fuzzer.so"
    if lib.exists():
        return lib
    rt = subprocess.run(
        [clang, "--print-runtime-dir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    asan, fuzzer = _archive(Path(rt), "asan"), _archive(Path(rt), "fuzzer_no_main")
    with tempfile.TemporaryDirectory() as tmp:
        objects = []
        for archive in (asan, fuzzer):
            where = Path(tmp) / archive.stem
            where.mkdir()
            subprocess.run(["ar", "x", str(archive)], cwd=where, check=True)
            # asan_preinit puts ASan first in .preinit_array, which a shared object may not
            # have; preloading the library puts it first instead.
            objects += [str(o) for o in sorted(where.glob("*.o")) if "preinit" not in o.name]
        subprocess.run(
            [clang, "-shared", "-o", str(lib), *objects,
             "-lstdc++", "-lpthread", "-ldl", "-lrt", "-lm"],
            check=True,
        )  # fmt: skip
    return lib


def build(out: Path) -> tuple[Path, Path]:
    """(the instrumented extension, the runtime to preload), built if out of date."""
    clang = _clang()
    out.mkdir(parents=True, exist_ok=True)
    runtime = _runtime(clang, out)
    built = sorted((out / "lib" / "pycollective").glob("_native.*.so"))
    if not built or built[0].stat().st_mtime < _newest_input():
        env = dict(os.environ, CC=clang, LDSHARED=f"{clang} -shared", CFLAGS=FLAGS)
        env.pop("PYCOLLECTIVE_NATIVE", None)
        subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--force",
             "--build-lib", str(out / "lib"), "--build-temp", str(out / "tmp")],
            cwd=REPO, env=env, check=True, capture_output=True,
        )  # fmt: skip
        built = sorted((out / "lib" / "pycollective").glob("_native.*.so"))
    if not built:
        raise SystemExit("setup.py built no pycollective._native")
    return built[0], runtime


def environment(paths: tuple[Path, Path]) -> dict[str, str]:
    extension, runtime = paths
    return {
        "PYCOLLECTIVE_FUZZ_NATIVE": str(extension),
        "LD_PRELOAD": str(runtime),
        # Python's own allocations are not ours to judge; a report ends the run.
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "out" / "fuzz" / "native")
    args = ap.parse_args()
    for name, value in environment(build(args.out)).items():
        print(f"{name}={value}")


if __name__ == "__main__":
    main()
