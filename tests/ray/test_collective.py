"""pycollective as a ray.util.collective backend, in a real Ray cluster (one node here; two
namespace hosts in test_multihost_ray.py): every call Ray's API makes, on numpy arrays and
CPU torch tensors, checked against numpy and against Ray's own gloo backend in the same
actors; both ways of making a group; named groups side by side; destroy and re-create; the
job's secret; a killed actor ending its peer's call."""

from __future__ import annotations

import time

import _actors
import pytest
import ray
import ray.util.collective as col
from _actors import CALLS, Member, expected
from ray import cloudpickle
from ray.experimental import internal_kv

import pycollective.ray
from pycollective import _ray_job
from pycollective._errors import UsageError

cloudpickle.register_pickle_by_value(_actors)  # the workers import it from the driver

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def trio(cluster):
    """Three actors with a pycollective group "p3" of all three (init_collective_group)."""
    members = [Member.remote(r) for r in range(3)]
    assert ray.get([m.setup.remote("p3", 3) for m in members]) == [0, 1, 2]
    yield members
    for m in members:
        ray.kill(m)


def run(members, name, what, **kw) -> list[dict]:
    return ray.get([m.call.remote(name, what, **kw) for m in members], timeout=120)


@pytest.mark.parametrize("what", CALLS)
@pytest.mark.parametrize("kind, dtype", [("numpy", "float32"), ("numpy", "int64"),
                                         ("torch", "float32")])  # fmt: skip
def test_every_call_on_numpy_and_torch(trio, what, kind, dtype):
    got = run(trio, "p3", what, kind=kind, dtype=dtype, n=13, root=2)
    for rank, g in enumerate(got):
        assert g == expected(what, 3, rank, dtype, 13, "sum", 2), (rank, what)


@pytest.mark.parametrize("op", ["product", "min", "max"])
def test_every_reduce_op(trio, op):
    for what in ("allreduce", "reduce", "reducescatter"):
        got = run(trio, "p3", what, dtype="int64", n=5, op=op, root=1)
        for rank, g in enumerate(got):
            assert g == expected(what, 3, rank, "int64", 5, op, 1), (rank, what, op)


def test_reducescatter_is_one_reduce_scatter(cluster):
    """Ray's gloo backend runs one all-reduce per rank; this is one reduce-scatter, which
    puts (p-1)/p of a rank's input on the wire (gloo's emulation: p all-reduces of one
    part each, 2 (p-1) parts). Over TCP here, so that the bytes show."""
    tcp = Member.options(runtime_env={"env_vars": {"PYCOLLECTIVE_TRANSPORT": "tcp"}})
    members = [tcp.remote(r) for r in range(3)]
    try:
        ray.get([m.setup.remote("rs", 3) for m in members])
        n = 1 << 16
        calls = ray.get([m.calls_made.remote("rs") for m in members])
        sent = ray.get([m.tcp_bytes_sent.remote("rs") for m in members])  # counting from here
        got = run(members, "rs", "reducescatter", n=n)
        assert [g["out"] for g in got] == [expected("reducescatter", 3, r, "float32", n, "sum", 0)
                                           ["out"] for r in range(3)]  # fmt: skip
        assert ray.get([m.calls_made.remote("rs") for m in members]) == [c + 1 for c in calls]
        after = ray.get([m.tcp_bytes_sent.remote("rs") for m in members])
        part = n * 4
        for a, b in zip(sent, after, strict=True):
            assert 2 * part <= b - a < 2 * part + 4096, (a, b)  # (p-1) parts, and headers
    finally:
        for m in members:
            ray.kill(m)


def test_same_results_as_rays_gloo_backend_in_the_same_actors(cluster):
    members = [Member.remote(r) for r in range(2)]
    try:
        ray.get([m.setup.remote("default", 2, backend="gloo") for m in members])
        ray.get([m.setup.remote("mine", 2) for m in members])
        for what in CALLS:
            for kind in ("numpy", "torch"):
                ours = run(members, "mine", what, kind=kind, n=33, root=1)
                gloo = run(members, "default", what, kind=kind, n=33, root=1)
                assert ours == gloo, (what, kind)
    finally:
        for m in members:
            ray.kill(m)


def test_declared_from_the_driver_with_create_collective_group(cluster):
    members = [Member.remote(r) for r in range(2)]
    try:
        # ranks reversed: actor 0 is rank 1
        col.create_collective_group(members, 2, [1, 0], backend="pycollective",
                                    group_name="declared")  # fmt: skip
        got = run(members, "declared", "allgather", n=4)
        ranks = [1, 0]
        for actor, g in enumerate(got):
            assert g == expected("allgather", 2, ranks[actor], "float32", 4, "sum", 0)
        assert ray.get([m.destroy.remote("declared") for m in members]) == [False, False]
    finally:
        for m in members:
            ray.kill(m)


def test_named_groups_side_by_side_then_destroyed_and_made_again(cluster):
    """Groups "ab" (actors 0, 1) and "bc" (actors 1, 2, ranks reversed) in the same actors,
    calls interleaved; destroying one leaves the other working; the name can be reused;
    no key of theirs is left in Ray's KV."""
    a, b, c = (Member.remote(r) for r in range(3))
    try:
        ray.get([a.setup.remote("ab", 2, 0), b.setup.remote("ab", 2, 1)])
        ray.get([b.setup.remote("bc", 2, 1), c.setup.remote("bc", 2, 0)])
        for _ in range(3):
            ab = run([a, b], "ab", "allreduce", n=7)
            bc = run([c, b], "bc", "allreduce", n=9)
            assert all(g == expected("allreduce", 2, r, "float32", 7, "sum", 0)
                       for r, g in enumerate(ab))  # fmt: skip
            assert all(g == expected("allreduce", 2, r, "float32", 9, "sum", 0)
                       for r, g in enumerate(bc))  # fmt: skip
        assert ray.get([a.destroy.remote("ab"), b.destroy.remote("ab")]) == [False, False]
        bc = run([c, b], "bc", "broadcast", n=3, root=1)
        assert all(g == expected("broadcast", 2, r, "float32", 3, "sum", 1)
                   for r, g in enumerate(bc))  # fmt: skip
        with pytest.raises(ray.exceptions.RayTaskError, match="not initialized"):
            ray.get(a.call.remote("ab", "allreduce"))
        ray.get([a.setup.remote("ab", 2, 1), b.setup.remote("ab", 2, 0)])  # again, swapped
        ab = run([b, a], "ab", "allreduce", n=5)
        assert all(g == expected("allreduce", 2, r, "float32", 5, "sum", 0)
                   for r, g in enumerate(ab))  # fmt: skip
        for m, name in ((a, "ab"), (b, "ab"), (b, "bc"), (c, "bc")):
            ray.get(m.destroy.remote(name))
        job = ray.get_runtime_context().get_job_id()
        left = internal_kv._internal_kv_list(f"{job}/group/", namespace=_ray_job.NAMESPACE)
        assert left == [], left
    finally:
        for m in (a, b, c):
            ray.kill(m)


def test_register_is_idempotent_and_refuses_another_class(cluster):
    from ray.util.collective.backend_registry import BackendRegistry

    pycollective.ray.register()
    pycollective.ray.register()
    registry = BackendRegistry()
    assert registry.get("pycollective") is pycollective.ray.PycollectiveGroup
    assert col.is_backend_available("pycollective")

    class Other(pycollective.ray.PycollectiveGroup):
        pass

    saved = registry._map["PYCOLLECTIVE"]
    registry._map["PYCOLLECTIVE"] = Other
    try:
        with pytest.raises(UsageError, match="already has a backend named 'PYCOLLECTIVE'"):
            pycollective.ray.register()
    finally:
        registry._map["PYCOLLECTIVE"] = saved


def test_the_job_secret_is_made_once_for_the_job_and_the_runtime_envs_wins(cluster):
    job = ray.get_runtime_context().get_job_id()
    kept = internal_kv._internal_kv_get(_ray_job.secret_key(job), namespace=_ray_job.NAMESPACE)
    assert kept is not None and len(kept) == 64  # made by the driver's register()
    members = [Member.remote(r) for r in range(2)]
    given = Member.options(runtime_env={"env_vars": {"PYCOLLECTIVE_SECRET": "s3cr3t-of-the-env"}})
    other = given.remote(0)
    try:
        assert ray.get([m.secret.remote() for m in members]) == [kept, kept]
        assert _ray_job.job_secret() == kept
        assert ray.get(other.secret.remote()) == b"s3cr3t-of-the-env"
    finally:
        for m in (*members, other):
            ray.kill(m)


def test_peers_with_another_secret_are_refused(cluster):
    """An actor whose runtime env sets another secret cannot join the group: both sides
    fail (the joiner is refused, the other times out waiting), none hangs."""
    env = {"PYCOLLECTIVE_TIMEOUT": "5"}
    plain = Member.options(runtime_env={"env_vars": env}).remote(0)
    other = Member.options(
        runtime_env={"env_vars": dict(env, PYCOLLECTIVE_SECRET="not-the-jobs")}
    ).remote(1)
    try:
        t0 = time.monotonic()
        refs = [plain.setup.remote("split", 2), other.setup.remote("split", 2)]
        errors = []
        for ref in refs:
            with pytest.raises(ray.exceptions.RayTaskError) as err:
                ray.get(ref, timeout=60)
            errors.append(str(err.value))
        assert time.monotonic() - t0 < 40
        assert any("secret" in e for e in errors), errors
    finally:
        for m in (plain, other):
            ray.kill(m)


def test_a_killed_actor_ends_its_peers_call(cluster):
    members = [Member.remote(r) for r in range(2)]
    try:
        ray.get([m.setup.remote("doomed", 2) for m in members])
        looping = members[0].loop.remote("doomed", 60)
        other = members[1].loop.remote("doomed", 60)
        time.sleep(1.0)
        ray.kill(members[1])
        t0 = time.monotonic()
        said = ray.get(looping, timeout=60)
        assert time.monotonic() - t0 < 30
        assert said.split()[0] in ("TransportError", "CollectiveTimeout"), said
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(other, timeout=30)
    finally:
        for m in members:
            ray.kill(m)
