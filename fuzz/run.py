"""Runs fuzz targets for a bounded time each and says what they found (`make fuzz`).

    python -m fuzz.run [--seconds 60] [--native] [TARGET ...]

Each target runs under atheris in a process of its own, seeded with fuzz/corpus/TARGET
(read only: what the fuzzer finds new goes to out/fuzz/TARGET/corpus), with libFuzzer's
bounds on an input's time (-timeout) and the process's memory (-rss_limit_mb). A crash,
a contract broken, a hang or a blown memory bound stops the target; its input is written
to out/fuzz/TARGET/ and the run fails, naming it and the command that replays it.
`--native` runs NATIVE_TARGETS (arena_words; transport_frames, whose swap takes the
compiled round) against a build of the compiled core instrumented for coverage and
AddressSanitizer (python -m fuzz.native; clang needed).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import TARGETS

NATIVE_TARGETS = ("arena_words", "transport_frames")  # the targets that reach compiled code

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "fuzz" / "corpus"
TIMEOUT_SECONDS = 10  # one input: far above any target's slowest honest input
RSS_LIMIT_MB = 2048


@dataclass
class Result:
    target: str
    ok: bool
    returncode: int
    runs: int
    seconds: float
    output: str
    artifact: str | None

    @property
    def per_second(self) -> float:
        return self.runs / self.seconds if self.seconds else 0.0


def command(target: str, seconds: float, work: Path, extra: list[str] | None = None) -> list[str]:
    work.mkdir(parents=True, exist_ok=True)
    (work / "corpus").mkdir(exist_ok=True)
    return [
        sys.executable, "-m", "fuzz", target,
        f"-max_total_time={max(1, round(seconds))}",
        f"-timeout={TIMEOUT_SECONDS}",
        f"-rss_limit_mb={RSS_LIMIT_MB}",
        f"-artifact_prefix={work}/",
        "-print_final_stats=1",
        *(extra or []),
        str(work / "corpus"),  # the first folder is the one libFuzzer writes to
        str(CORPUS / target),
    ]  # fmt: skip


def parse(target: str, returncode: int, out: str, started: float) -> Result:
    """A target's run, from libFuzzer's output (-print_final_stats=1)."""
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", out)
    took = re.search(r"Done (\d+) runs in (\d+) second", out)
    artifact = re.search(r"Test unit written to (\S+)", out)
    return Result(
        target=target,
        ok=returncode == 0,
        returncode=returncode,
        runs=int(runs.group(1)) if runs else 0,
        seconds=float(took.group(2)) if took else time.monotonic() - started,
        output=out,
        artifact=artifact.group(1) if artifact else None,
    )


def run(target: str, seconds: float, work: Path, env: dict[str, str] | None = None) -> Result:
    t0 = time.monotonic()
    proc = subprocess.run(
        command(target, seconds, work),
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=seconds + 10 * TIMEOUT_SECONDS + 120,
    )
    return parse(target, proc.returncode, proc.stdout, t0)


def report(r: Result) -> str:
    if r.ok:
        return f"{r.target:18s} ok  {r.runs:9d} inputs in {r.seconds:5.0f} s  {r.per_second:8.0f}/s"
    tail = "\n".join(
        line for line in r.output.splitlines()[-60:] if not line.startswith("INFO: Instrumenting")
    )
    replay = f"python -m fuzz {r.target} {r.artifact}" if r.artifact else "(no input written)"
    return f"{r.target:18s} FAILED ({r.returncode}) after {r.runs} inputs; replay: {replay}\n{tail}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="*", default=list(TARGETS))
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("FUZZ_SECONDS", "60")))
    ap.add_argument("--out", type=Path, default=REPO / "out" / "fuzz")
    ap.add_argument("--native", action="store_true", help="NATIVE_TARGETS on an ASan build")
    args = ap.parse_args()
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        raise SystemExit(f"unknown targets {sorted(unknown)}; targets: {TARGETS}")
    failed = []
    for target in args.targets:
        env = None
        if args.native and target in NATIVE_TARGETS:
            from . import native

            env = native.environment(native.build(args.out / "native"))
        r = run(target, args.seconds, args.out / target, env)
        print(report(r) + (" (compiled core under ASan)" if env else ""), flush=True)
        if not r.ok:
            failed.append(target)
    if failed:
        raise SystemExit(f"fuzzing found problems in: {', '.join(failed)}")


if __name__ == "__main__":
    main()
