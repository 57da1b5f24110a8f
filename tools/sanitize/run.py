"""`make sanitize`: pycollective._native built with AddressSanitizer + UndefinedBehavior-
Sanitizer, and separately with ThreadSanitizer, each into build/sanitize/<name>/ (the
normal build in src/ and .venv is left alone), and the tests that drive the C core run
under each: the arena's battery, the compiled per-call path, ranks killed mid-call and the
torch backend's async works.

    python tools/sanitize/run.py [--only asan,tsan] [--pytest-args "-x -k bits"]

CPython is not instrumented: the compiler's sanitizer runtime is preloaded (LD_PRELOAD) into
every process, and tools/sanitize/site/sitecustomize.py (on PYTHONPATH, which the ranks the tests
start inherit) makes each process import the sanitized extension. Every report goes to a
file in build/sanitize/<name>/reports/ (whichever process made it, even a rank whose
failure a test expects); a run passes only with none there, its canary reported (a
deliberate error in tools/sanitize/canary.c: the set-up is not blind) and at least one
process having loaded the sanitized extension. Exit status 0 only if every run passed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
HERE = REPO / "tools" / "sanitize"
SITE = HERE / "site"
BUILD = REPO / "build" / "sanitize"
DEBUG = ("-g", "-fno-omit-frame-pointer")
# A runtime names a report's frames with llvm-symbolizer, started with the reporting
# process's environment: this wrapper drops LD_PRELOAD (see the file).
SYMBOLIZER = HERE / "bin" / "llvm-symbolizer"

# What runs under both sanitizers: one or two cases of each kind of test that drives the
# C core (the others repeat the same C at other sizes; `make test` runs them all). Under a
# sanitizer every rank starts 3-5x slower, so this is what fits in about five minutes for
# both on an idle 2-core machine (README "Tests" has the timings).
ARENA = (
    "tests/native/test_native_arena.py::"
    "test_compiled_arena_matches_the_reference_and_the_python_arena"
)
FAST = "tests/native/test_fast_path.py::"
SHM = "tests/shm/test_shm_jobs.py::"
BOTH = (
    # the arena's battery: the compiled arena against the reference (forked ranks, and
    # compiled beside Python ranks), every collective x dtype x op in a real 3-rank job
    f"{ARENA}[3-compiled]",
    f"{ARENA}[4-mixed]",
    # single copy: the reference's bits, and a peer's unreachable buffer failing the call
    "tests/native/test_single_copy.py",
    # a TCP reduction read and combined by the compiled core (recv_reduce, GIL released)
    # beside the exchange threads of two transports; its bounds against a peer
    "tests/transport/test_fold.py",
    "tests/security/test_fold_attacks.py",
    # a small swap's compiled round (send, poll, reduce; GIL released): numpy's bits, what
    # it hands over, its argument checks; and repeated calls of a real 2-rank TCP job
    "tests/transport/test_swap_round.py",
    "tests/security/test_swap_round_attacks.py",
    "tests/transport/test_swap_path.py::test_repeated_calls_give_the_regular_paths_bits[mixed]",
    # the whole repeated small swap in C (csrc/swappath.c): in process, every decline and
    # hand-over; and a real job's repeated calls of every dtype and op
    "tests/transport/test_swap_path_compiled.py",
    "tests/transport/test_swap_path.py::test_repeated_calls_give_the_regular_paths_bits[bits]",
    # the copy that sidesteps memcpy's skewed case, at every skew and size around its cuts
    "tests/native/test_copy.py",
    f"{SHM}test_battery_with_transport_forced[shm-3]",
    # the compiled per-call path: the Python reference's bits (small calls, and large ones
    # by single copy, shared buffers declined), the flight recorder's
    # entries filled in C, a mismatch, a killed peer, a timeout, async calls beside
    # waiting threads
    f"{FAST}test_repeated_calls_give_the_python_references_bits[3]",
    f"{FAST}test_repeated_large_all_reduces_go_by_single_copy_with_the_references_bits[2]",
    f"{FAST}test_flight_recorder_shows_compiled_calls_as_python_ones",
    f"{FAST}test_a_mismatch_after_repeated_calls_raises_on_every_rank[op]",
    f"{FAST}test_peers_waiting_in_a_compiled_call_for_a_killed_rank_raise_at_once[3-0-all_reduce]",
    f"{FAST}test_peers_waiting_in_a_compiled_call_for_a_killed_rank_raise_at_once[3-2-all_gather]",
    f"{FAST}test_a_timeout_in_a_compiled_call_names_the_rank_and_diagnose_finds_it",
    f"{FAST}test_async_calls_and_waiting_threads_keep_their_order",
    # ranks killed with SIGKILL mid-call while the others wait in the compiled arena, and
    # through shared buffers; kill -9 under the launcher
    f"{SHM}test_killed_rank_reaches_every_survivor_within_two_seconds[4-2-64]",
    f"{SHM}test_peers_waiting_for_a_killed_rank_raise_at_once[3-2-1048576]",
    f"{SHM}test_kill_9_with_shared_buffers_leaves_nothing_in_dev_shm",
    "tests/faults/test_chaos.py::test_kill_9_reaches_every_survivor_and_the_launcher_names_the_rank[3-11-0.2-1]",
    # the torch backend at 3 ranks: every op, async works completed on its completion
    # threads with then() callbacks, over the compiled arena. (tests/torch/
    # test_torch_completion.py runs one rank, where no call reaches the extension:
    # nothing there for a sanitizer of it to see.)
    "tests/torch/test_torch_backend_ops.py::test_every_op_gives_torch_semantics",
)
# The kernels, in process (every op x dtype, every half-precision value, hypothesis over
# any bits): memory and undefined behaviour; single-threaded, so not under TSan.
ASAN_ONLY = ("tests/native/test_native_kernels.py",)
# Latency bounds of the tests (tests/_launch.within) stretched for the slower builds.
TIME_SCALE = "5"


@dataclass(frozen=True)
class Sanitizer:
    name: str
    cc: str  # the compiler whose runtime is used (see SANITIZERS)
    flags: tuple[str, ...]  # compiler and linker
    runtime: str  # the compiler's shared runtime, preloaded into the uninstrumented python
    env: dict[str, str]  # options; {reports}: the reports folder, {symbolizer}: SYMBOLIZER
    canaries: tuple[tuple[str, int, str], ...]  # (function, argument, text of its report)
    tests: tuple[str, ...]


SANITIZERS = {
    # clang: its ASan runtime holds UBSan's too, so both kinds of report go to one log file.
    # gcc loads libubsan beside libasan, and libubsan's log_path is set through a function
    # both export: libasan's answers, and UBSan's reports stay on the rank's stderr, where
    # a test expecting that rank to fail would not notice them.
    "asan": Sanitizer(
        name="asan",
        cc="clang",
        # -fno-sanitize-recover=all: a UBSan finding ends the process like an ASan one.
        # -shared-libsan: the runtime as a shared library, the one preloaded. Python's own
        # CFLAGS (setup.py's base) carry -fwrapv, so signed overflow is defined here as in
        # the shipped build and not reported; the rest of "undefined" is. clang ignores
        # the kernels' `#pragma GCC target("arch=...")`: their C is checked, not their ISA.
        flags=(
            "-fsanitize=address,undefined,float-cast-overflow",
            "-fno-sanitize-recover=all",
            "-shared-libsan",
            *DEBUG,
        ),  # fmt: skip
        runtime="libclang_rt.asan-x86_64.so",
        env={
            # Leaks are not checked: CPython keeps its own allocations to the end by design
            # and every stack of the extension's allocations starts in it.
            "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:log_path={reports}/asan:"
            "external_symbolizer_path={symbolizer}",
            # one runtime, one file: the last log_path set wins for both
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:log_path={reports}/asan",
            # Python objects from malloc, not pymalloc's arenas: an overrun of a small
            # Python buffer by the C code then lands in ASan's redzone.
            "PYTHONMALLOC": "malloc",
        },
        canaries=(
            ("canary_heap_overflow", 8, "heap-buffer-overflow"),
            ("canary_shift", 40, "shift exponent 40 is too large"),
        ),  # fmt: skip
        tests=BOTH + ASAN_ONLY,
    ),
    # gcc: clang 14's TSan runtime crashes at start preloaded into CPython; gcc 12's runs.
    "tsan": Sanitizer(
        name="tsan",
        cc="gcc",
        # -Wno-tsan: gcc warns that TSan does not model atomic_thread_fence. The arena's
        # fences order stores against another process's loads (wake-ups through shared
        # memory), which TSan cannot see in any case: it watches one process's threads.
        flags=("-fsanitize=thread", "-Wno-tsan", *DEBUG),
        runtime="libtsan.so",
        env={
            # ignore_noninstrumented_modules: accesses that interceptors (memcpy, free...)
            # see from CPython, numpy or torch are not recorded, so a report is a race
            # between two accesses of the extension itself; their synchronisation
            # (the GIL's mutex, pthread calls) still counts.
            "TSAN_OPTIONS": "halt_on_error=1:ignore_noninstrumented_modules=1:"
            "second_deadlock_stack=1:log_path={reports}/tsan:"
            "external_symbolizer_path={symbolizer}:"
            f"suppressions={HERE / 'tsan.supp'}",
        },
        canaries=(("canary_race", 0, "data race"),),
        tests=BOTH,
    ),
}


def log(text: str) -> None:
    print(f"[sanitize] {text}", flush=True)


def runtime_path(s: Sanitizer) -> str:
    try:
        found = subprocess.run([s.cc, f"-print-file-name={s.runtime}"],
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
    except FileNotFoundError:
        found = ""
    if not os.path.isabs(found) or not os.path.exists(found):
        raise SystemExit(
            f"no {s.cc} with {s.runtime}: make sanitize needs clang and its runtimes "
            "(Debian: clang, libclang-rt-dev) and gcc's libtsan (Debian: libtsan2)"
        )
    return os.path.realpath(found)


def linker(cc: str) -> str:
    """This interpreter's command for linking extensions (its library paths), with `cc`."""
    ldshared = shlex.split(sysconfig.get_config_var("LDSHARED") or "cc -shared")
    return shlex.join([cc, *ldshared[1:]])


def build(s: Sanitizer, where: Path) -> Path:
    """setup.py's own extension (its source list and flags) with the sanitizer's flags
    added, into `where`: never in place."""
    runtime_path(s)  # says what is missing before a build fails for it
    flags = " ".join(s.flags)
    env = {**os.environ, "CC": s.cc, "LDSHARED": linker(s.cc), "CFLAGS": flags,
           "LDFLAGS": flags}  # fmt: skip
    env.pop("PYCOLLECTIVE_NATIVE", None)
    cmd = [sys.executable, "setup.py", "-q", "build_ext", "--force", "--parallel", "2",
           "--build-lib", str(where / "lib"), "--build-temp", str(where / "tmp")]  # fmt: skip
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    warnings = [x for x in (out.stdout + out.stderr).splitlines() if "warning:" in x]
    for line in warnings:
        log(f"  {line}")
    built = sorted((where / "lib" / "pycollective").glob("_native.*.so"))
    if out.returncode != 0 or not built:
        raise SystemExit(f"{s.name} build failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    needed = subprocess.run(["readelf", "-d", str(built[0])], capture_output=True,
                            text=True, check=True).stdout  # fmt: skip
    if s.runtime.split(".so")[0] not in needed:
        raise SystemExit(f"{built[0]} does not link {s.runtime}: not a {s.name} build")
    return built[0]


def environment(s: Sanitizer, extension: Path, reports: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({k: v.format(reports=reports, symbolizer=SYMBOLIZER) for k, v in s.env.items()})
    real = (
        shutil.which("llvm-symbolizer")
        or subprocess.run(
            ["clang", "-print-prog-name=llvm-symbolizer"], capture_output=True, text=True
        ).stdout.strip()
    )
    env["SANITIZE_SYMBOLIZER"] = real
    env["LD_PRELOAD"] = runtime_path(s)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), env.get("PYTHONPATH")]))
    env["SANITIZE_NATIVE_EXTENSION"] = str(extension)
    env["SANITIZE_REPORT_DIR"] = str(reports)
    env["SANITIZE_TIME_SCALE"] = TIME_SCALE
    env.pop("PYCOLLECTIVE_NATIVE", None)  # the compiled path on
    return env


def found(reports: Path) -> list[Path]:
    return sorted(p for p in reports.iterdir() if not p.name.startswith("loaded."))


def check_canaries(s: Sanitizer, where: Path, env: dict[str, str], reports: Path) -> None:
    """Each deliberate error must be reported, in a file, by a process that then fails."""
    lib = where / "canary.so"
    subprocess.run([s.cc, "-shared", "-fPIC", "-O1", *s.flags, "-o", str(lib),
                    str(HERE / "canary.c")], check=True)  # fmt: skip
    for function, arg, text in s.canaries:
        code = f"import ctypes; ctypes.CDLL({str(lib)!r}).{function}({arg})"
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             timeout=120)  # fmt: skip
        texts = [p.read_text(errors="replace") for p in found(reports)]
        if run.returncode == 0 or not any(text in t for t in texts):
            raise SystemExit(
                f"{s.name}: the canary {function} went unreported (exit {run.returncode}, "
                f"reports {[p.name for p in found(reports)]}): the run would be blind"
            )
        for p in found(reports):
            p.unlink()
    log(f"{s.name}: canaries reported ({', '.join(c[0] for c in s.canaries)})")


def check_extension(env: dict[str, str], extension: Path) -> None:
    code = "import pycollective._native as n, pycollective.shm.native as s; " \
           "print(n.__file__); assert s.enabled(), 'the compiled arena is off'"  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO,
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode != 0 or out.stdout.strip() != str(extension):
        raise SystemExit(f"the sanitized extension is not the one imported:\n"
                         f"{out.stdout}{out.stderr[-3000:]}")  # fmt: skip


def run(s: Sanitizer, tests: list[str] | None, pytest_args: list[str]) -> bool:
    where = BUILD / s.name
    reports = where / "reports"
    t0 = time.monotonic()
    extension = build(s, where)
    t_build = time.monotonic() - t0
    log(f"{s.name}: built {extension.relative_to(REPO)} in {t_build:.0f} s")
    reports.mkdir(parents=True, exist_ok=True)
    for p in reports.iterdir():
        p.unlink()
    env = environment(s, extension, reports)
    check_canaries(s, where, env, reports)
    check_extension(env, extension)
    for p in reports.iterdir():
        p.unlink()
    t1 = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args,
           *(tests or s.tests)]  # fmt: skip
    rc = subprocess.run(cmd, cwd=REPO, env=env).returncode
    t_tests = time.monotonic() - t1
    problems = found(reports)
    loaded = sum(1 for p in reports.iterdir() if p.name.startswith("loaded."))
    for p in problems:
        log(f"--- {s.name} report {p.name}:\n{p.read_text(errors='replace')[-6000:]}")
    ok = rc == 0 and not problems and loaded > 0
    log(f"{s.name}: {'PASS' if ok else 'FAIL'}: pytest exit {rc}, {len(problems)} report(s), "
        f"{loaded} process(es) loaded the sanitized extension; build {t_build:.0f} s, "
        f"tests {t_tests:.0f} s")  # fmt: skip
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="asan,tsan", help="comma-separated: asan, tsan")
    ap.add_argument("--tests", nargs="*", help="pytest node ids instead of the default set")
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments, one string")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n]
    unknown = sorted(set(names) - set(SANITIZERS))
    if unknown:
        ap.error(f"--only: unknown {unknown}; accepted: {', '.join(SANITIZERS)}")
    t0 = time.monotonic()
    results = {n: run(SANITIZERS[n], a.tests, shlex.split(a.pytest_args))
               for n in names}  # fmt: skip
    log(
        f"done in {time.monotonic() - t0:.0f} s (load {os.getloadavg()[0]:.1f}): "
        + ", ".join(f"{n} {'passed' if ok else 'FAILED'}" for n, ok in results.items())
    )
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
