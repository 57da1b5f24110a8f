"""Run on every rank of a real job: every collective x dtype x op x algorithm, checked against
numpy references each rank computes on its own. Exit status 0 only if every check passed.

    python tests/api/battery.py [--torch] [--quick] [--digest] [--no-bfloat16]

--digest prints a hash of every result's bytes (`digest <hex>`, in no particular order),
so two runs can be compared bit for bit (tests/native: the compiled arena against the
Python one).
"""

from __future__ import annotations

import functools
import hashlib
import sys
import traceback

import numpy as np

import pycollective as dist
from pycollective import ReduceOp, UsageError

# bfloat16 is ml_dtypes', whose import costs half a second of CPU in every rank. Jobs whose
# subject is how ranks are started and find each other (tests/api/test_launchers.py,
# test_slurm.py: torchrun, mpirun, hydra, srun, PMI, our launcher) leave it out with
# --no-bfloat16; every other run of the battery checks it (test_collectives.py at 1-5 and 8
# ranks, the forced transports, the compiled arena, TLS, the hierarchy's fake hosts).
BF16 = None
if "--no-bfloat16" not in sys.argv:
    try:
        import ml_dtypes

        BF16 = np.dtype(ml_dtypes.bfloat16)
    except ImportError:  # pragma: no cover
        pass

DTYPES = [
    np.float16,
    np.float32,
    np.float64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.bool_,
    np.complex64,
    np.complex128,
]
if BF16 is not None:
    DTYPES.append(BF16)
OPS = list(ReduceOp)

failures: list[str] = []
checks = 0
results: list[str] = []  # name and hash of every repeatable result (--digest)


def check(name: str, got, want, repeatable: bool = True) -> None:
    """`repeatable`: the result's bits are the same in every run (not so for an inexact sum
    whose order follows the order messages arrive in): only those go into the digest."""
    global checks
    checks += 1
    got = np.asarray(got)
    want = np.asarray(want)
    if repeatable:
        h = hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest()
        results.append(f"{name} {h}")
    if got.shape != want.shape or not np.array_equal(
        got.astype(np.float64) if got.dtype == BF16 else got,
        want.astype(np.float64) if want.dtype == BF16 else want,
    ):
        failures.append(f"{name}: got {got.ravel()[:8]} want {want.ravel()[:8]}")


def valid(op: ReduceOp, dt: np.dtype) -> bool:
    kind = np.dtype(dt).kind if np.dtype(dt) != BF16 else "f"
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        return kind in "iub"
    if op in (ReduceOp.MIN, ReduceOp.MAX) and kind == "c":
        return False
    if op is ReduceOp.AVG and kind == "b":
        return False
    return True


def data(rank: int, n: int, dt, op: ReduceOp = ReduceOp.SUM, salt: int = 0) -> np.ndarray:
    """Deterministic per-rank data whose reductions are exact in every dtype."""
    dt = np.dtype(dt)
    idx = np.arange(n)
    if dt == np.bool_:
        return (idx + rank + salt) % 3 == 0
    if op is ReduceOp.PRODUCT:
        base = ((idx + rank + salt) % 2) + 1
    elif dt.kind == "u":
        base = (idx * 7 + rank * 3 + salt) % 11
    else:
        base = (idx * 7 + rank * 3 + salt) % 11 - 5
    return base.astype(dt)


def reference(op: ReduceOp, arrays: list[np.ndarray], p: int) -> np.ndarray:
    dt = arrays[0].dtype
    if dt == np.bool_:
        fn = {
            ReduceOp.SUM: np.logical_or,
            ReduceOp.MAX: np.logical_or,
            ReduceOp.BOR: np.logical_or,
            ReduceOp.PRODUCT: np.logical_and,
            ReduceOp.MIN: np.logical_and,
            ReduceOp.BAND: np.logical_and,
            ReduceOp.BXOR: np.logical_xor,
        }[op]
        return functools.reduce(fn, arrays)
    fn = {
        ReduceOp.SUM: np.add,
        ReduceOp.AVG: np.add,
        ReduceOp.PRODUCT: np.multiply,
        ReduceOp.MIN: np.minimum,
        ReduceOp.MAX: np.maximum,
        ReduceOp.BAND: np.bitwise_and,
        ReduceOp.BOR: np.bitwise_or,
        ReduceOp.BXOR: np.bitwise_xor,
    }[op]
    out = functools.reduce(lambda a, b: fn(a, b).astype(dt), arrays)
    if op is ReduceOp.AVG:
        if dt.kind in "iu":
            out = np.trunc(out.astype(np.float64) / p).astype(dt)
        else:
            out = (out / dt.type(p)).astype(dt)
    return out


def counts(p: int, quick: bool) -> list[int]:
    return [0, 1, p + 1, 1000 + p] if quick else sorted({0, 1, max(p - 1, 0), p + 1, 1000 + p})


def test_all_reduce(r: int, p: int, quick: bool) -> None:
    for dt in DTYPES:
        for op in OPS:
            if not valid(op, dt):
                x = data(r, 5, dt, op)
                try:
                    dist.all_reduce(x, op=op)
                except UsageError:
                    continue
                failures.append(f"all_reduce {op!r} on {np.dtype(dt)} did not raise UsageError")
                continue
            x = data(r, 13, dt, op)
            dist.all_reduce(x, op=op)
            check(
                f"all_reduce {np.dtype(dt)} {op!r}",
                x,
                reference(op, [data(i, 13, dt, op) for i in range(p)], p),
            )
    for algo in dist.algorithms("all_reduce"):
        for n in counts(p, quick):
            for dt, op in (
                (np.float32, ReduceOp.SUM),
                (np.int32, ReduceOp.MAX),
                (np.float64, ReduceOp.AVG),
            ):
                x = data(r, n, dt, op)
                dist.all_reduce(x, op=op, algorithm=algo)
                check(
                    f"all_reduce {algo} n={n} {np.dtype(dt)} {op!r}",
                    x,
                    reference(op, [data(i, n, dt, op) for i in range(p)], p),
                )
        # bitwise-identical float results across ranks, with inexact values
        x = np.random.default_rng(r).standard_normal(777).astype(np.float32)
        dist.all_reduce(x, algorithm=algo)
        gathered = np.zeros(p * x.size, dtype=np.float32)
        dist.all_gather_into_tensor(gathered, x)
        check(
            f"all_reduce {algo} identical on all ranks",
            gathered.reshape(p, -1),
            np.broadcast_to(x, (p, x.size)),
            repeatable=algo in ("auto", "shm"),  # the arena folds in rank order
        )


def test_repeated_large(r: int, p: int) -> None:
    """Many large collectives back to back, so messages of the next round or collective
    arrive while this rank is still busy (the early-message paths of the transport)."""
    rng = np.random.default_rng(1234)
    for algo in dist.algorithms("all_reduce")[1:]:
        for it in range(6):
            n = int(rng.integers(100_000, 300_000))
            x = np.full(n, r + it, dtype=np.float32)
            dist.all_reduce(x, algorithm=algo)
            check(
                f"repeated all_reduce {algo} #{it}",
                x[:: max(1, n // 7)],
                np.full(len(x[:: max(1, n // 7)]), sum(range(p)) + p * it, dtype=np.float32),
            )
    for algo in dist.algorithms("all_gather")[1:]:
        for it in range(3):
            out = np.zeros(p * 200_000, dtype=np.float32)
            dist.all_gather_into_tensor(out, np.full(200_000, r + it, np.float32), algorithm=algo)
            check(
                f"repeated all_gather {algo}", out[::200_000], np.arange(p, dtype=np.float32) + it
            )


def test_broadcast_reduce(r: int, p: int, quick: bool) -> None:
    roots = range(p) if p <= 4 or not quick else (0, p - 1)
    for algo in dist.algorithms("broadcast"):
        for n in counts(p, quick):
            for root in roots:
                x = data(r, n, np.int64, salt=root)
                dist.broadcast(x, src=root, algorithm=algo)
                check(f"broadcast {algo} n={n} root={root}", x, data(root, n, np.int64, salt=root))
    for algo in dist.algorithms("reduce"):
        for n in counts(p, quick):
            for root in roots:
                for dt, op in (
                    (np.float32, ReduceOp.SUM),
                    (np.uint8, ReduceOp.BXOR),
                    (np.float64, ReduceOp.AVG),
                ):
                    x = data(r, n, dt, op)
                    before = x.copy()
                    dist.reduce(x, dst=root, op=op, algorithm=algo)
                    if r == root:
                        want = reference(op, [data(i, n, dt, op) for i in range(p)], p)
                    else:
                        want = before
                    check(f"reduce {algo} n={n} root={root} {op!r}", x, want)


def test_gathers(r: int, p: int, quick: bool) -> None:
    for algo in dist.algorithms("all_gather"):
        for n in counts(p, quick):
            mine = data(r, n, np.float64)
            out = np.zeros(p * n)
            dist.all_gather_into_tensor(out, mine, algorithm=algo)
            check(
                f"all_gather_into_tensor {algo} n={n}",
                out,
                np.concatenate([data(i, n, np.float64) for i in range(p)]),
            )
            outs = [np.zeros(n, dtype=np.float64) for _ in range(p)]
            dist.all_gather(outs, mine, algorithm=algo)
            for i in range(p):
                check(f"all_gather {algo} n={n} [{i}]", outs[i], data(i, n, np.float64))
    for algo in dist.algorithms("reduce_scatter"):
        for n in counts(p, quick):
            for dt, op in (
                (np.int32, ReduceOp.SUM),
                (np.float32, ReduceOp.MIN),
                (np.float32, ReduceOp.AVG),
            ):
                full = [data(i, p * n, dt, op) for i in range(p)]
                inp = full[r].copy()
                out = np.zeros(n, dtype=dt)
                dist.reduce_scatter_tensor(out, inp, op=op, algorithm=algo)
                want = reference(op, full, p)[r * n : (r + 1) * n]
                check(f"reduce_scatter_tensor {algo} n={n} {op!r}", out, want)
                check(f"reduce_scatter_tensor {algo} input unchanged", inp, full[r])
                out2 = np.zeros(n, dtype=dt)
                dist.reduce_scatter(
                    out2, [inp[i * n : (i + 1) * n].copy() for i in range(p)], op=op, algorithm=algo
                )
                check(f"reduce_scatter {algo} n={n} {op!r}", out2, want)
    roots = range(p) if p <= 4 or not quick else (0, p - 1)
    for algo in dist.algorithms("gather"):
        for n in counts(p, quick):
            for root in roots:
                mine = data(r, n, np.int16)
                lst = [np.zeros(n, dtype=np.int16) for _ in range(p)] if r == root else None
                dist.gather(mine, lst, dst=root, algorithm=algo)
                if r == root:
                    for i in range(p):
                        check(
                            f"gather {algo} n={n} root={root} [{i}]", lst[i], data(i, n, np.int16)
                        )
    for algo in dist.algorithms("scatter"):
        for n in counts(p, quick):
            for root in roots:
                out = np.zeros(n, dtype=np.float32)
                lst = [data(i, n, np.float32, salt=root) for i in range(p)] if r == root else None
                dist.scatter(out, lst, src=root, algorithm=algo)
                check(f"scatter {algo} n={n} root={root}", out, data(r, n, np.float32, salt=root))


def test_all_to_all(r: int, p: int, quick: bool) -> None:
    for n in counts(p, quick):
        inp = np.concatenate([np.full(n, r * 100 + j, dtype=np.int32) for j in range(p)])
        out = np.zeros(p * n, dtype=np.int32)
        dist.all_to_all_single(out, inp)
        check(
            f"all_to_all_single n={n}",
            out,
            np.concatenate([np.full(n, j * 100 + r, dtype=np.int32) for j in range(p)]),
        )
    # uneven: rank r sends (r + j) % 3 rows of width 2 to rank j
    send = [(r + j) % 3 for j in range(p)]
    recv = [(j + r) % 3 for j in range(p)]
    inp = np.concatenate([np.full((send[j], 2), r * 100 + j, dtype=np.float64) for j in range(p)])
    out = np.zeros((sum(recv), 2))
    dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
    want = np.concatenate([np.full((recv[j], 2), j * 100 + r, dtype=np.float64) for j in range(p)])
    check("all_to_all_single uneven", out, want)
    ins = [np.full(j + 1, r * 10 + j, dtype=np.int64) for j in range(p)]
    outs = [np.zeros(r + 1, dtype=np.int64) for _ in range(p)]
    dist.all_to_all(outs, ins)
    for j in range(p):
        check(f"all_to_all list [{j}]", outs[j], np.full(r + 1, j * 10 + r))


def test_barrier_async_objects(r: int, p: int) -> None:
    dist.barrier()
    works = []
    arrays = []
    for k in range(4):
        x = np.full(10, r + k, dtype=np.float32)
        arrays.append(x)
        works.append(dist.all_reduce(x, async_op=True))
    for k, (w, x) in enumerate(zip(works, arrays, strict=True)):
        assert w.wait() is True
        check(f"async all_reduce {k}", x, np.full(10, sum(range(p)) + p * k, dtype=np.float32))
        assert w.is_completed()
        fut = w.get_future()
        res = fut.wait()
        assert res[0] is x, "future value is the list of output tensors"
    w = dist.barrier(async_op=True)
    w.wait()
    objs = [None] * p
    dist.all_gather_object(objs, {"rank": r, "blob": "x" * r})
    check("all_gather_object", [o["rank"] for o in objs], list(range(p)))
    lst = [f"hello {r}", r] if r == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    check("broadcast_object_list", np.array(lst[1]), np.array(0))
    got = [None] * p if r == p - 1 else None
    dist.gather_object(("from", r), got, dst=p - 1)
    if r == p - 1:
        check("gather_object", np.array([g[1] for g in got]), np.arange(p))
    out = [None]
    dist.scatter_object_list(out, [{"to": i} for i in range(p)] if r == 0 else None, src=0)
    check("scatter_object_list", np.array(out[0]["to"]), np.array(r))


def test_p2p(r: int, p: int) -> None:
    if p == 1:
        return
    right, left = (r + 1) % p, (r - 1) % p
    send = np.full(1000, r, dtype=np.float64)
    recv = np.zeros(1000)
    rw = dist.irecv(recv, src=left, tag=7)
    sw = dist.isend(send, dst=right, tag=7)
    rw.wait()
    sw.wait()
    check("ring isend/irecv", recv, np.full(1000, left))
    # big messages both ways at once cannot deadlock
    big = np.full(4_000_000, r, dtype=np.float32)
    got = np.zeros_like(big)
    ops = [dist.P2POp(dist.isend, big, right), dist.P2POp(dist.irecv, got, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check("batch_isend_irecv 16 MB", got[::100000], np.full(40, left, dtype=np.float32))
    # tags: sent 1 then 2, received 2 then 1
    if r == 0:
        dist.send(np.array([1.0]), dst=1, tag=1)
        dist.send(np.array([2.0]), dst=1, tag=2)
    elif r == 1:
        a, b = np.zeros(1), np.zeros(1)
        dist.recv(b, src=0, tag=2)
        dist.recv(a, src=0, tag=1)
        check("tag matching", np.array([a[0], b[0]]), np.array([1.0, 2.0]))
    # any source
    if r == 0:
        seen = set()
        for _ in range(p - 1):
            x = np.zeros(1, dtype=np.int64)
            src = dist.recv(x)
            check("recv any source value", x, np.array([src]))
            seen.add(src)
        check("recv any source", np.array(sorted(seen)), np.arange(1, p))
    else:
        dist.send(np.array([r], dtype=np.int64), dst=0)
    dist.barrier()


def test_groups(r: int, p: int) -> None:
    evens = dist.new_group([i for i in range(p) if i % 2 == 0])
    odds = dist.new_group([i for i in range(p) if i % 2 == 1]) if p > 1 else None
    mine = evens if r % 2 == 0 else odds
    x = np.full(5, r, dtype=np.int64)
    dist.all_reduce(x, group=mine)
    members = [i for i in range(p) if i % 2 == r % 2]
    check("subgroup all_reduce", x, np.full(5, sum(members)))
    other = odds if r % 2 == 0 else evens
    if other is not None:
        assert dist.all_reduce(np.zeros(3), group=other) is None
        assert dist.get_rank(other) == -1
    check("group rank", np.array(dist.get_rank(mine)), np.array(members.index(r)))
    y = np.full(3, r, dtype=np.float32)
    dist.broadcast(y, src=members[-1], group=mine)
    check("subgroup broadcast global src", y, np.full(3, members[-1], dtype=np.float32))
    if p >= 2:
        pair = dist.new_group([0, p - 1])
        if r in (0, p - 1):
            z = np.ones(4)
            dist.all_reduce(z, group=pair)
            check("pair group", z, np.full(4, 2.0))
    dist.barrier()


def test_usage_errors(r: int, p: int) -> None:
    """Bad arguments raise UsageError on the rank that made them, before anything is sent;
    the next collective still works on every rank."""
    cases = [
        ("bitwise op on floats", lambda: dist.all_reduce(np.ones(3, np.float32), op=ReduceOp.BAND)),
        ("read-only buffer", lambda: dist.all_reduce(np.frombuffer(b"\x00" * 8, dtype=np.float32))),
        ("root out of range", lambda: dist.broadcast(np.ones(3), src=p)),
        ("negative root", lambda: dist.reduce(np.ones(3), dst=-1)),
        ("wrong output size", lambda: dist.all_gather_into_tensor(np.ones(p * 3 + 1), np.ones(3))),
        (
            "dtype mismatch",
            lambda: dist.all_gather_into_tensor(np.ones(p * 3, np.float32), np.ones(3)),
        ),
        ("unknown algorithm", lambda: dist.all_reduce(np.ones(3), algorithm="telepathy")),
        ("not a buffer", lambda: dist.all_reduce([1.0, 2.0])),
        ("non-contiguous", lambda: dist.all_reduce(np.ones((4, 4))[:, 0])),
        ("list length", lambda: dist.all_gather([np.ones(2)] * (p + 1), np.ones(2))),
        ("bad op", lambda: dist.all_reduce(np.ones(2), op="median")),
        ("avg on bool", lambda: dist.all_reduce(np.ones(2, bool), op=ReduceOp.AVG)),
        ("bad tag", lambda: dist.isend(np.ones(1), dst=(r + 1) % p, tag=-1)) if p > 1 else None,
        ("send to self", lambda: dist.send(np.ones(1), dst=r)),
        (
            "bad split sizes",
            lambda: dist.all_to_all_single(
                np.ones(p), np.ones(p), input_split_sizes=[p + 1] + [0] * (p - 1)
            ),
        ),
    ]
    for case in cases:
        if case is None:
            continue
        name, fn = case
        try:
            fn()
        except UsageError:
            pass
        except Exception as exc:  # noqa: BLE001
            failures.append(f"usage error '{name}' raised {type(exc).__name__}: {exc}")
        else:
            failures.append(f"usage error '{name}' did not raise")
    x = np.ones(4)
    dist.all_reduce(x)
    check("all_reduce after usage errors", x, np.full(4, float(p)))


def test_torch(r: int, p: int) -> None:
    import torch

    for dt in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.int8,
        torch.bool,
    ):
        t = (torch.arange(12) % 5 + r).to(dt)
        dist.all_reduce(t, op=ReduceOp.MAX)
        want = (torch.arange(12) % 5 + (p - 1)).to(dt)
        if dt == torch.bool:
            want = torch.ones(12, dtype=torch.bool)
        if not torch.equal(t, want):
            failures.append(f"torch all_reduce MAX {dt}: {t[:5]} vs {want[:5]}")
    t = torch.ones(3, 4, dtype=torch.bfloat16) * (r + 1)
    dist.all_reduce(t)
    if not torch.equal(t, torch.full((3, 4), float(p * (p + 1) // 2), dtype=torch.bfloat16)):
        failures.append(f"torch bf16 sum {t}")
    t = torch.tensor(float(r))  # 0-d
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    if t.item() != sum(range(p)):
        failures.append("0-d tensor all_reduce")
    out = [torch.zeros(2, 3) for _ in range(p)]
    dist.all_gather(out, torch.full((2, 3), float(r)))
    if not all(torch.equal(out[i], torch.full((2, 3), float(i))) for i in range(p)):
        failures.append("torch all_gather")
    grad = torch.ones(5, requires_grad=True)
    with torch.no_grad():
        g = grad * 2
    dist.all_reduce(g)
    work = dist.all_reduce(torch.ones(4), async_op=True)
    res = work.get_future().wait()
    if not torch.equal(res[0], torch.full((4,), float(p))):
        failures.append("torch async future value")
    try:
        dist.all_reduce(torch.ones(4, 4).t())
        failures.append("non-contiguous tensor accepted")
    except UsageError:
        pass
    # torch's own ReduceOp works too
    import torch.distributed as tdist

    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t, op=tdist.ReduceOp.PRODUCT)
    want = float(np.prod(np.arange(1, p + 1)))
    if not torch.equal(t, torch.full((3,), want)):
        failures.append(f"torch ReduceOp.PRODUCT {t}")


def main() -> int:
    dist.init_process_group()
    r = dist.get_rank()
    run_checks()
    dist.destroy_process_group()
    return report(r)


def run_checks() -> None:
    """Every check, on the default group (already initialized); failures are collected."""
    quick = "--quick" in sys.argv
    r, p = dist.get_rank(), dist.get_world_size()
    tests = [
        lambda: test_usage_errors(r, p),
        lambda: test_all_reduce(r, p, quick),
        lambda: test_broadcast_reduce(r, p, quick),
        lambda: test_repeated_large(r, p),
        lambda: test_gathers(r, p, quick),
        lambda: test_all_to_all(r, p, quick),
        lambda: test_barrier_async_objects(r, p),
        lambda: test_p2p(r, p),
        lambda: test_groups(r, p),
    ]
    if "--torch" in sys.argv:
        tests.append(lambda: test_torch(r, p))
    for t in tests:
        try:
            t()
        except Exception:  # noqa: BLE001
            failures.append(traceback.format_exc())
            break  # the job is out of step now; stop instead of hanging


def report(r: int) -> int:
    """Print this rank's summary line (tests parse it); the exit status."""
    print(f"rank {r}: {checks} checks, {len(failures)} failures")
    if "--digest" in sys.argv:
        # sorted: receives from any source may complete (and be checked) in any order
        joined = "\n".join(sorted(results)).encode()
        print(f"digest {hashlib.sha256(joined).hexdigest()}")
    for f in failures[:20]:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
