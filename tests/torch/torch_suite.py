"""torch's own backend test suite against the pycollective backend.

The suite is `torch/testing/_internal/distributed/distributed_test.py` (shipped in the torch
wheel, ~290 tests of every collective, DDP, groups, timeouts, Join...); this harness is our
own, modelled on torch's `test/distributed/test_distributed_spawn.py`:

    python tests/torch/torch_suite.py --world-size 2 [--mode as-pycollective,in-gloo-place]
        [--subset] [-k SUBSTRING ...] [--json OUT]

Passes (--mode, comma separated; one process runs several: each loads its own copy of the
suite, whose skip decorators read BACKEND at import):

- ``as-pycollective``: BACKEND=pycollective. Our capabilities are declared in torch's
  ``DistTestCases.backend_feature`` sets wherever gloo is listed and we support the feature
  (ddp, subgroup, plugin; not gpu/cuda). Tests the suite gates on the literal name "gloo"
  (``BACKEND != "gloo"``) run too when they test a feature we have: UNGATED below.
- ``in-gloo-place``: BACKEND=gloo, but every process group torch creates for "gloo" is a
  pycollective one (torch's ``ProcessGroupGloo`` constructor in distributed_c10d is
  replaced, in the ranks only), so the tests written for gloo run against us with torch's
  Python layer believing it talks to gloo. Tests that inspect gloo itself are EXCLUDED.
- ``gloo``: torch's own gloo, for comparison.

Ranks are forked from the harness after the suite is imported, instead of spawned (which
re-imports torch and the 11,000-line suite in every rank of every test, ~3 s each here).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import types
import unittest
from pathlib import Path
from typing import Any

# A run is bounded per test (torch's default is 300 s); the few that need longer have
# torch's own overrides (TIMEOUT_OVERRIDE in common_distributed).
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "120")

MODES = ("as-pycollective", "in-gloo-place", "gloo")


# In the as-pycollective pass, a test the suite skips for us at import but runs for gloo
# (its gate names gloo: `BACKEND != "gloo"`, `require_backend_is_available({"gloo"})`, or
# the "gpu"/"cuda" feature sets, which list gloo for DDP tests that run on CPU) has its
# skip lifted, and the report lists it with the suite's gate. Not lifted: CUDA tests,
# which skip at run time for gloo too on a machine without GPUs.
def _lift_gate(name: str) -> bool:
    return "cuda" not in name


# Tests not run in the in-gloo-place pass, each with why: they inspect gloo itself, not
# the collectives torch routes through a process group.
EXCLUDED_IN_GLOO_PLACE: dict[str, str] = {
    "test_ddp_logging_data_cpu": (
        "asserts the name DDP's C++ logger reads from the group (getBackendName()) is "
        "\"gloo\": the group in gloo's place keeps its own name, because DDP's logger, given "
        '"gloo", looks up gloo\'s C++ backend object ("Could not find backend type 1"); '
        "passes as pycollective"
    ),
}

_BODY_NAMES_GLOO = (
    'its body picks the CPU path with `BACKEND == "gloo"` (or mpi) and has none for any '
    "other CPU backend (UnboundLocalError before any collective); passes in gloo's place"
)
_MONITORED = (
    "torch's dist.monitored_barrier raises ValueError for every backend not named gloo "
    "before reaching it; passes in gloo's place, and the group method torch leaves open "
    "(pg.monitored_barrier) is tested in tests/torch/test_torch_clients.py"
)

# Tests not run as pycollective, each with why.
EXCLUDED_AS_PYCOLLECTIVE: dict[str, str] = {
    "test_accumulate_gradients_no_sync": _BODY_NAMES_GLOO,
    "test_accumulate_gradients_no_sync_allreduce_hook": _BODY_NAMES_GLOO,
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": _BODY_NAMES_GLOO,
    "test_accumulate_gradients_no_sync_grad_is_view": _BODY_NAMES_GLOO,
    "test_monitored_barrier_gloo": _MONITORED,
    "test_monitored_barrier_gloo_subgroup": _MONITORED,
    "test_monitored_barrier_failure_order": _MONITORED,
    "test_monitored_barrier_wait_all_ranks": _MONITORED,
    "test_monitored_barrier_allreduce_hang": _MONITORED,
    "test_monitored_barrier_allreduce_hang_wait_all_ranks": _MONITORED,
}

# The representative subset `make test` runs, both passes (tests/torch/test_torch_suite.py):
# every collective kind gloo runs on CPU, DDP, groups, timeouts, profiling.
SUBSET: tuple[str, ...] = (
    "test_all_reduce_sum", "test_all_reduce_max", "test_all_reduce_min",
    "test_all_reduce_product", "test_all_reduce_sum_async", "test_all_reduce_sum_complex",
    "test_all_reduce_full_group_sum", "test_all_reduce_coalesced_sum",
    "test_all_reduce_coalesced_max", "test_all_reduce_complex_unsupported_ops",
    "test_sparse_all_reduce_sum", "test_broadcast", "test_broadcast_full_group",
    "test_reduce_sum", "test_reduce_max", "test_reduce_full_group_sum", "test_reduce_sum_twice",
    "test_all_gather", "test_all_gather_complex", "test_all_gather_full_group",
    "test_all_gather_coalesced_simple", "test_all_gather_coalesced_with_empty",
    "test_all_gather_object_default_pg", "test_all_gather_object_subgroup", "test_gather",
    "test_gather_checks", "test_scatter", "test_scatter_checks", "test_scatter_object_list",
    "test_send_recv", "test_send_recv_any_source", "test_send_recv_with_tag", "test_isend",
    "test_irecv", "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
    "test_send_recv_autograd_profiler", "test_barrier", "test_barrier_full_group",
    "test_barrier_timeout_full_group", "test_monitored_barrier_gloo",
    "test_monitored_barrier_gloo_rank_0_timeout",
    "test_DistributedDataParallelCPU", "test_DistributedDataParallel_requires_grad",
    "test_ddp_create_graph", "test_get_future", "test_grads_same_across_ranks_with_no_sync",
    "test_static_graph_api_cpu", "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_get_rank_size_group", "test_destroy_group", "test_get_backend",
    "test_Backend_enum_class",
)  # fmt: skip


def _suite_path() -> Path:
    spec = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


def suite_test_names() -> list[str]:
    """The names of the suite's tests (read from its source, without importing it)."""
    text = _suite_path().read_text()
    return re.findall(r"^        def (test_\w+)\(", text, flags=re.M)


def _load_suite(backend: str, name: str) -> types.ModuleType:
    """A copy of distributed_test.py imported with BACKEND=backend (its decorators read it
    at import time, so each pass needs its own copy)."""
    os.environ["BACKEND"] = backend
    # The backend's module too, once, before any rank forks: torch's autoload hook only
    # registers a creator that imports it at a group's creation (in every forked rank).
    importlib.import_module("pycollective.torch")
    spec = importlib.util.spec_from_file_location(name, _suite_path())
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _declare_capabilities() -> None:
    """Add "pycollective" to torch's feature sets where gloo is listed and we have the
    feature: DDP, subgroups, and plugin (a third-party backend torch should treat as
    available). Not gpu/cuda: the backend is CPU only."""
    from torch.testing._internal.common_distributed import DistTestCases

    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add("pycollective")


# torch's harness polls every 0.1 s twice per test and more: its file barrier (before and
# after every test, and within many) and the parent's wait for its ranks to exit. Half a
# poll lost each time is about a third of a short test here; the polls made at
# _POLL_SECONDS instead leave every test's own sleeps and timeouts as they are.
_POLL_SECONDS = 0.01
_TORCH_POLL = 0.1  # the one poll interval torch's harness sleeps


class _FasterPolls:
    """The `time` module as the polling functions see it: the same, but a poll's sleep of
    _TORCH_POLL seconds lasts _POLL_SECONDS."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(_POLL_SECONDS if seconds == _TORCH_POLL else seconds)


def _with_faster_polls(fn: Any) -> Any:
    """`fn` (a function) with `time` in its globals replaced by _FasterPolls(): its code and
    every other name it uses are unchanged."""
    env = dict(fn.__globals__, time=_FasterPolls())
    fast = types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, fn.__closure__)
    fast.__kwdefaults__, fast.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    return fast


def _poll_faster(module: types.ModuleType) -> None:
    """Only the two polling loops: the suite's Barrier.sync and the parent's
    MultiProcessTestCase._join_processes (each sleeps nowhere but in its poll)."""
    from torch.testing._internal.common_distributed import MultiProcessTestCase

    barrier = module.Barrier
    if not getattr(barrier.sync, "_faster_polls", False):
        fast = _with_faster_polls(barrier.sync.__func__)
        fast._faster_polls = True
        barrier.sync = classmethod(fast)
    join = MultiProcessTestCase._join_processes
    if not getattr(join, "_faster_polls", False):
        fast = _with_faster_polls(join)
        fast._faster_polls = True
        MultiProcessTestCase._join_processes = fast


def _route_gloo_to_pycollective() -> None:
    """In a rank of the in-gloo-place pass: the groups distributed_c10d builds for "gloo"
    are pycollective groups (torch's Python layer still records them as gloo)."""
    import torch.distributed.distributed_c10d as c10d

    from pycollective.torch import PycollectiveProcessGroup

    class InGlooPlace(PycollectiveProcessGroup):
        _profile_name = "gloo"  # the events torch's tests look for

        def __init__(self, store: Any, rank: int, size: int, timeout: Any = None) -> None:
            if timeout is None:
                timeout = datetime.timedelta(seconds=60)
            super().__init__(store, rank, size, timeout)
            # distributed_c10d writes these on the gloo backend it made
            self.options = types.SimpleNamespace(global_ranks_in_group=[], group_name="")

        # getBackendName() stays "pycollective": torch's C++ side (DDP's logger) looks a
        # gloo-named group's gloo internals up by that name.

    c10d.ProcessGroupGloo = InGlooPlace


def _make_case(module: types.ModuleType, mode: str) -> type[unittest.TestCase]:
    import torch.distributed as dist
    import torch.multiprocessing as tmp

    base = module.TestDistBackend

    class Case(base, module.DistributedTest._DistTestBase):  # type: ignore[misc, name-defined]
        pass_name = mode

        def setUp(self) -> None:
            super().setUp()
            self._start_processes(tmp.get_context("fork").Process)

        @classmethod
        def _run(cls, rank: int, test_name: str, file_name: str, pipe: Any, **kwargs: Any):
            _quiet_rank(test_name, rank)
            if mode == "in-gloo-place":
                _route_gloo_to_pycollective()
            try:
                super()._run(rank, test_name, file_name, pipe, **kwargs)
            finally:
                # A failed test exits its rank without destroying its groups: release
                # sockets, threads and shared memory here (the rank is about to exit).
                with contextlib.suppress(Exception):
                    if dist.is_initialized():
                        dist.destroy_process_group()

    Case.__name__ = Case.__qualname__ = "Test_" + mode.replace("-", "_")
    return Case


_logs = Path(tempfile.gettempdir())  # set by run(); torch's setUp replaces TEMP_DIR per test


def _log_path(test_name: str, rank: int) -> Path:
    return _logs / f"{test_name}.rank{rank}.log"


def _quiet_rank(test_name: str, rank: int) -> None:
    """A rank writes its output to a log file, shown only when its test fails."""
    path = _log_path(test_name, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _rank_logs(test_name: str, world_size: int) -> str:
    parts = []
    for rank in range(world_size):
        path = _log_path(test_name, rank)
        if path.exists():
            text = path.read_text(errors="replace")
            parts.append(f"--- rank {rank} log (tail)\n{text[-2500:]}")
    return "\n".join(parts)


def _gloo_only_gates(ours: types.ModuleType, gloo: types.ModuleType) -> dict[str, str]:
    """Tests skipped at import in our copy but not in gloo's, with our copy's reason."""
    out = {}
    for name in dir(ours.DistributedTest._DistTestBase):
        if not name.startswith("test_"):
            continue
        f = getattr(ours.DistributedTest._DistTestBase, name)
        g = getattr(gloo.DistributedTest._DistTestBase, name)
        if getattr(f, "__unittest_skip__", False) and not getattr(g, "__unittest_skip__", False):
            out[name] = getattr(f, "__unittest_skip_why__", "")
    return out


class _Result(unittest.TestResult):
    def __init__(self, verbose: bool) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []
        self._t0 = 0.0
        self._verbose = verbose

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's name
        super().startTest(test)
        self._t0 = time.monotonic()

    def _record(self, test: unittest.TestCase, outcome: str, detail: str = "") -> None:
        name = test.id().rsplit(".", 1)[-1]
        if outcome == "failed":
            detail = f"{detail}\n{_rank_logs(name, int(os.environ['WORLD_SIZE']))}"
        rec = {"test": name, "outcome": outcome, "seconds": round(time.monotonic() - self._t0, 2)}
        if detail:
            rec["detail"] = detail[-8000:]
        self.records.append(rec)
        if self._verbose or outcome in ("failed", "error"):
            print(f"  {outcome:7s} {rec['seconds']:6.2f}s {name}", flush=True)
            if outcome in ("failed", "error"):
                print(detail[-3000:], flush=True)

    def addSuccess(self, test):  # noqa: N802
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):  # noqa: N802
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):  # noqa: N802
        super().addError(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):  # noqa: N802
        super().addSkip(test, reason)
        self._record(test, "skipped", str(reason))

    def addExpectedFailure(self, test, err):  # noqa: N802
        super().addExpectedFailure(test, err)
        self._record(test, "passed")

    def addUnexpectedSuccess(self, test):  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")


def run(
    modes: list[str], world_size: int, names: list[str] | None, patterns: list[str],
    verbose: bool = False, keep_logs: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    global _logs
    temp = tempfile.mkdtemp(prefix="pycollective-torch-suite-")
    _logs = Path(temp) / "logs"
    os.environ.update(WORLD_SIZE=str(world_size), TEMP_DIR=temp)
    report: dict[str, Any] = {"world_size": world_size, "passes": {}}
    try:
        import torch  # noqa: F401 - before the suite, which expects it imported

        _declare_capabilities()  # imports common_distributed, which logs every start at INFO
        logging.getLogger("torch.testing._internal.common_distributed").setLevel(logging.WARNING)
        copies = {
            "as-pycollective": ("pycollective", "pycollective_suite_as_pycollective"),
            "in-gloo-place": ("gloo", "pycollective_suite_in_gloo_place"),
            "gloo": ("gloo", "pycollective_suite_gloo"),
        }
        loaded: dict[str, types.ModuleType] = {}
        for backend, modname in {copies[m] for m in modes}:
            loaded[modname] = _load_suite(backend, modname)
            _poll_faster(loaded[modname])
        for mode in modes:
            backend, modname = copies[mode]
            module = loaded[modname]
            excluded: dict[str, str] = {}
            ungated: dict[str, str] = {}
            if mode == "as-pycollective":
                gloo = loaded.get(copies["gloo"][1]) or _load_suite(*copies["gloo"])
                _poll_faster(gloo)
                loaded[copies["gloo"][1]] = gloo
                gates = _gloo_only_gates(module, gloo)
                for name, gate in gates.items():
                    if _lift_gate(name):
                        f = getattr(module.DistributedTest._DistTestBase, name)
                        f.__unittest_skip__ = False
                        ungated[name] = gate
                excluded = EXCLUDED_AS_PYCOLLECTIVE
            elif mode == "in-gloo-place":
                excluded = EXCLUDED_IN_GLOO_PLACE
            case = _make_case(module, mode)
            loader = unittest.TestLoader()
            tests = [
                t
                for t in loader.loadTestsFromTestCase(case)
                if _selected(t.id().rsplit(".", 1)[-1], names, patterns)
            ]
            result = _Result(verbose)
            t0 = time.monotonic()
            print(f"== {mode}, world size {world_size}: {len(tests)} tests", flush=True)
            for t in tests:
                name = t.id().rsplit(".", 1)[-1]
                if name in excluded:
                    result.records.append(
                        {"test": name, "outcome": "excluded", "detail": excluded[name]}
                    )
                    continue
                t.run(result)
            counts = {
                k: sum(r["outcome"] == k for r in result.records)
                for k in ("passed", "failed", "skipped", "excluded")
            }
            seconds = round(time.monotonic() - t0, 1)
            print(f"== {mode}, world size {world_size}: {counts} in {seconds} s", flush=True)
            report["passes"][mode] = {
                "counts": counts,
                "seconds": seconds,
                "ungated": ungated,
                "records": result.records,
            }
    finally:
        if keep_logs and (Path(temp) / "logs").exists():
            shutil.copytree(Path(temp) / "logs", keep_logs, dirs_exist_ok=True)
        shutil.rmtree(temp, ignore_errors=True)
    return report


def _selected(name: str, names: list[str] | None, patterns: list[str]) -> bool:
    if names is not None and name not in names:
        return False
    return not patterns or any(p in name for p in patterns)


def _without_local_paths(text: str) -> str:
    """Reports are committed: tracebacks name files relative to the repository and the
    Python environment, not by this machine's paths."""
    repo = str(Path(__file__).resolve().parents[2])
    for prefix, name in (
        (sys.prefix, "<python>"),
        (repo, "<repo>"),
        (tempfile.gettempdir(), "<tmp>"),
    ):
        text = text.replace(prefix, name)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="as-pycollective,in-gloo-place")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--subset", action="store_true", help="the representative subset only")
    p.add_argument("-k", action="append", default=[], help="run tests whose name has this")
    p.add_argument("--json", help="write the report here")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--keep-logs", metavar="DIR", help="copy every rank's log here")
    args = p.parse_args(argv)
    modes = [m for m in args.mode.split(",") if m]
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    report = run(modes, args.world_size, list(SUBSET) if args.subset else None, args.k,
                 args.verbose, args.keep_logs)  # fmt: skip
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(_without_local_paths(json.dumps(report, indent=1)))
    failed = sum(p["counts"]["failed"] for p in report["passes"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
