"""DeepSpeed's CPU shared-memory all-reduce as a column of compare_peers.py.

DeepSpeed is not a dependency of pycollective: it lives in a venv of its own under
benchmarks/ (.venv-deepspeed, gitignored), with torch pinned to the same CPU build as the
project's (an unpinned torch pulls a CUDA build of several GB), mpi4py for the OpenMPI
column and pycollective itself (editable, so the ranks run this checkout). When that venv
exists, compare_peers.py starts the shared-memory job's ranks with its Python and every
library takes turns in the same processes. DS_ACCELERATOR=cpu makes DeepSpeed build its
shm op with its own JIT builder (ninja and g++, cached under ~/.cache/torch_extensions);
torch.ops.deepspeed.inference_all_reduce_ is the call measured: SUM of float32 (its
kernels need AVX2) or bfloat16/float16 (AVX-512BW), ranks all on one host.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VENV = HERE / ".venv-deepspeed"
TORCH = "torch==2.13.0"  # the project's pin (pyproject.toml): the CPU build


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def unsupported() -> str | None:
    """Why DeepSpeed's shm all-reduce cannot run here, or None."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return f"DeepSpeed's CPU shm kernels need x86-64 Linux (this is {platform.machine()})"
    flags = _cpu_flags()
    if "avx512bw" not in flags:
        return "DeepSpeed's CPU shm kernels need AVX-512BW, which this CPU lacks"
    if not shutil.which("g++"):
        return "DeepSpeed builds its shm op with g++, which is not installed"
    return None


def python() -> Path:
    return VENV / "bin" / "python"


def ensure(allow_install: bool) -> tuple[Path | None, str | None]:
    """(the venv's Python, None), or (None, why the DeepSpeed column is left out)."""
    why = unsupported()
    if why:
        return None, why
    py = python()
    if not py.exists():
        if not allow_install:
            return None, f"no DeepSpeed venv ({VENV.relative_to(REPO)}); run without --no-install"
        print(f"# building {VENV.relative_to(REPO)}: {TORCH}, deepspeed, mpi4py", flush=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
            pip = [str(py), "-m", "pip", "install", "--quiet"]
            subprocess.run([*pip, "--upgrade", "pip"], check=True)
            subprocess.run([*pip, TORCH, "deepspeed", "numpy", "ml_dtypes", "mpi4py"], check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            return None, f"could not build the DeepSpeed venv: {exc}"
    # pycollective as this checkout (cheap when it is there already)
    done = VENV / ".pycollective-installed"
    if not done.exists() or done.read_text() != str(REPO):
        try:
            subprocess.run(
                [str(py), "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(REPO)],
                check=True,
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            return None, f"could not install pycollective into the DeepSpeed venv: {exc}"
        done.write_text(str(REPO))
    probe = subprocess.run(
        [str(py), "-c", "import deepspeed, torch, mpi4py; print(deepspeed.__version__)"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        tail = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"DeepSpeed does not import in its venv: {tail}"
    return py, None


class DeepSpeed:
    """torch.ops.deepspeed.inference_all_reduce_ on CPU tensors (all_reduce SUM only)."""

    name = "deepspeed"

    def __init__(self, transport: str, spec: dict) -> None:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        # DeepSpeed takes its shm path only when every rank is local: it reads LOCAL_SIZE.
        os.environ.setdefault("LOCAL_SIZE", os.environ.get("WORLD_SIZE", "1"))
        import deepspeed
        import deepspeed.comm as dscomm

        import torch

        self.torch = torch
        # After the gloo backend (compare_peers lists it first): DeepSpeed then reuses its
        # torch.distributed group instead of making one.
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank, self.size = dscomm.get_rank(), dscomm.get_world_size()
        self.version = deepspeed.__version__
        op = getattr(getattr(torch.ops, "deepspeed", None), "inference_all_reduce_", None)
        if op is None:
            raise SystemExit("compare_peers: DeepSpeed's shm op did not build")
        self.op = op

    def library(self) -> str:
        return f"DeepSpeed {self.version}"

    def algorithms(self, collective: str, wanted: list[str]) -> list[str]:
        return ["shm"] if collective == "all_reduce" else []

    def chosen(self, collective: str, algorithm: str, count: int, dtype: str) -> str:
        return algorithm

    def call(self, collective: str, algorithm: str, count: int, dtype: str) -> Callable[[], Any]:
        if collective != "all_reduce" or dtype not in ("float32", "bfloat16", "float16"):
            raise SystemExit(f"compare_peers: DeepSpeed has no {collective} of {dtype}")
        x = self.torch.ones(count, dtype=getattr(self.torch, dtype))
        op = self.op
        return lambda: op(x)

    def max(self, values: Any) -> Any:
        tensor = self.torch.from_numpy(values)
        self.torch.distributed.all_reduce(tensor, op=self.torch.distributed.ReduceOp.MAX)
        return values

    def barrier(self) -> None:
        self.torch.distributed.barrier()

    def close(self) -> None:
        # DeepSpeed never unlinks its shm buffer (a file per rank in /dev/shm, named after
        # the uid, MASTER_ADDR, MASTER_PORT and the rank): this rank removes its own. The
        # peers' mappings outlive the name. gloo's backend destroys the process group.
        name = "deepspeed_allreduce_buffer_{}_{}_{}_{}".format(
            os.getuid(),
            os.environ.get("MASTER_ADDR", ""),
            os.environ.get("MASTER_PORT", ""),
            self.rank,
        )
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:
            pass
