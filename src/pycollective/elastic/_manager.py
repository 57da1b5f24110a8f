"""The elastic Manager: owns the group of an elastic job and remakes it when members come
and go, at step boundaries, without a restart (docs/elastic.md).

One step, as the manager sees it:

    start_step()        at a boundary: remake the group if a member was lost (the last
                        step failed) or one is waiting to join; members behind receive the
                        state of the member furthest ahead
    allreduce(...)      collectives of the step; a failure is recorded, not raised
    should_commit()     True if every collective of this step succeeded here: apply the
                        update then (the committed step count goes up), skip it otherwise

The step in flight when a member dies is committed on the members whose collectives all
completed and redone on the others; the next round hands the first group's state to the
second, so every member ends the round at the same committed step, bit for bit.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _config, _launch_env, _netutil
from .._errors import CollectiveError, StoreError, UsageError
from .._reduce_ops import ReduceOp
from ..api import collectives as _coll
from ..api import objects as _objects
from ..core import rendezvous
from ..core.group import ProcessGroup
from ..core.world import World
from ..store import EtcdStore, TCPStore
from ._errors import ElasticError, JobFinished
from ._flat import flat_plan
from ._quorum import Decision, Registration, decide
from ._store import WatchedStore, connect_store, etcd_hosts, wait_for_change

log = logging.getLogger("pycollective.elastic")

_POLL = 0.01  # seconds between looks at a round's registrations
_JOIN_POLL = 0.05  # the leader's watcher looks for newcomers in the store this often
_WATCH_PIECE = 5.0  # etcd: a round's watch is one request this long (then made again)


@dataclass
class Event:
    """One membership change, as this member saw it (Manager.events)."""

    round: int
    members: list[str]
    rank: int
    lost: list[str]
    joined: list[str]
    step: int  # committed steps after the round (after any state transfer)
    received_state: bool
    started: float  # time.time() when this member began the round
    seconds: float  # until the new group was ready here
    reason: str = ""


class Manager:
    """Owns the process group of an elastic job and remakes it as members come and go.

    `state_dict()` returns what a member that falls behind or joins must receive (model,
    optimizer, RNG... anything picklable); `load_state_dict(state)` applies it. The
    manager adds its own (committed steps, samples consumed) and transfers both.

    Membership bounds: `min_size` and `max_size` (default: PYCOLLECTIVE_ELASTIC=MIN:MAX,
    which `pycollective run --elastic` sets, else 1 and unbounded); the first round waits
    for `initial_size` members (default WORLD_SIZE) or, at `join_timeout`, `min_size`.
    `timeout` bounds every collective (default PYCOLLECTIVE_TIMEOUT). The store is an
    etcd cluster when PYCOLLECTIVE_STORE names one (`pycollective run --rdzv-backend etcd`
    sets it): then no rank and no host is special (docs/elastic.md). Otherwise it is the
    launcher's (under `pycollective run`), else the one at MASTER_ADDR:MASTER_PORT; when
    nobody serves it there, the first member starts a store process of its own that
    outlives it (see _storehost.py; it exits `store_idle` seconds after its last client
    left), so no member is the store's single point of failure.
    """

    def __init__(
        self,
        state_dict: Callable[[], Any] | None = None,
        load_state_dict: Callable[[Any], None] | None = None,
        *,
        min_size: int | None = None,
        max_size: int | None = None,
        initial_size: int | None = None,
        timeout: float | None = None,
        join_timeout: float = 10.0,
        setup_timeout: float = 15.0,
        store: TCPStore | EtcdStore | None = None,
        job: str | None = None,
        uid: str | None = None,
        store_idle: float = 30.0,
    ) -> None:
        env = _launch_env.detect()
        lo, hi = _config.get("PYCOLLECTIVE_ELASTIC") or (1, 1 << 30)
        self.min_size = lo if min_size is None else min_size
        self.max_size = hi if max_size is None else max_size
        world = env.world_size or 1
        self.initial_size = min(max(initial_size or world, self.min_size), self.max_size)
        if not 1 <= self.min_size <= self.max_size:
            raise UsageError(
                f"need 1 <= min_size <= max_size, got {self.min_size} and {self.max_size}"
            )
        if join_timeout <= 0 or setup_timeout <= 0:
            raise UsageError("join_timeout and setup_timeout must be positive seconds")
        self.timeout = _config.timeout_seconds(timeout)
        self.join_timeout = float(join_timeout)
        self.setup_timeout = float(setup_timeout)
        self._state_dict = state_dict
        self._load_state_dict = load_state_dict
        self.uid = uid or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._master_addr = env.master_addr or "127.0.0.1"
        self._order = env.rank if env.rank is not None else 1 << 30
        self._multi_node = env.multi_node
        self._etcd_url = rendezvous.etcd_url_of(None) if store is None else None
        if isinstance(store, EtcdStore) or self._etcd_url is not None:
            # etcd names the job itself (the URL's path): every launcher, on every host,
            # must find the same keys, whatever its own PYCOLLECTIVE_JOB_ID
            job = job or "job"
            hosts = etcd_hosts(store if isinstance(store, EtcdStore) else None, self._etcd_url)
            self._master_addr = env.master_addr or hosts[0]
            self._multi_node = env.multi_node or not all(map(_netutil.is_loopback, hosts))
        job = job or _config.get("PYCOLLECTIVE_JOB_ID") or "job"
        base = env.store_prefix.rstrip("/") + "/" if env.store_prefix else ""
        self._prefix = f"{base}elastic/{job}"
        if store is not None and not isinstance(store, (TCPStore, EtcdStore)):
            raise UsageError(
                f"an elastic Manager needs pycollective's TCPStore or EtcdStore (for their "
                f"leases), got {type(store).__name__}"
            )
        self.step = 0  # committed steps
        self._commit_round = -1  # the round of the last commit (with step: the state's name)
        self.samples = 0  # samples consumed by committed steps (ElasticSampler)
        self.events: list[Event] = []
        self.group: ProcessGroup | None = None
        self._world: World | None = None
        self._round: int | None = None  # the last round this member belonged to
        self._members: list[str] = []
        self._fresh = True
        self._error: BaseException | None = None
        self._pending = False  # a newcomer waits (seen by the last step's carrier)
        self._carried = False  # this step's gradients carried the joiner flag
        self._in_step = False
        self._store_warned = False
        self._joiner_seen: int | None = None  # the round whose successor a newcomer awaits
        self._closed = False
        self._sampler: Any = None
        self._flat: dict[Any, Any] = {}
        self._formed_at = 0  # etcd: the revision before the last round began to form
        self._owns_store = store is None
        self._store_idle = store_idle
        self._lease_store: TCPStore | None = None
        self._store = (
            store
            if store is not None
            else connect_store(
                env,
                self._etcd_url,
                self.timeout,
                self.setup_timeout,
                self._store_idle,
                self._key("store-started-by"),
            )
        )
        try:
            if isinstance(self._store, EtcdStore):
                # etcd: a lease with a TTL, renewed by the store's own thread; it ends when
                # this process dies or its host is cut off (within the TTL)
                self._store.set_lease(self._lease_key(self.uid), str(os.getpid()))
            else:
                # The lease rides a connection of its own, so nothing else can break it.
                self._lease_store = TCPStore(
                    self._store.host, self._store.port, timeout=self.timeout,
                    connect_timeout=self.setup_timeout,
                )  # fmt: skip
                self._lease_store.set_lease(self._lease_key(self.uid), str(os.getpid()))
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- what users read

    @property
    def rank(self) -> int:
        """This member's rank in the current group (-1 before the first round)."""
        return self.group.rank() if self.group is not None else -1

    @property
    def size(self) -> int:
        return self.group.size() if self.group is not None else 0

    @property
    def round(self) -> int | None:
        return self._round

    @property
    def members(self) -> list[str]:
        return list(self._members)

    def is_leader(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ the step cycle

    def steps(self, total: Any) -> Iterator[int]:
        """`for step in manager.steps(N):` runs steps until N are committed (by any member:
        one that falls behind and receives the state at step N stops too), then agrees with
        the others that the job is done (finish())."""
        while True:
            try:
                self.start_step()
            except JobFinished:
                log.info("elastic: the job finished before this member joined")
                return
            if total <= self.step:  # `total` may be any object comparing with an int
                break
            yield self.step
        self.finish()

    def start_step(self) -> None:
        """At a step boundary: remake the group if the last step failed here or a member
        waits to join (every member learns the same), then begin a step."""
        if self._closed:
            raise UsageError("this elastic Manager was closed")
        failure = self._store.failure if isinstance(self._store, EtcdStore) else None
        if failure is not None:
            raise ElasticError(f"the elastic job cannot go on: {failure}")
        need = self.group is None or self._error is not None
        if not need:
            need = self._joiner_waits()
        if need:
            self._reconfigure()
        self._error = None
        self._carried = False
        self._pending = False
        self._in_step = True

    def report_error(self, exc: BaseException) -> None:
        """Record a failure of this step that the manager did not see (a collective the
        script ran itself on manager.group): the step will not commit here."""
        if self._error is None:
            self._error = exc

    def errored(self) -> BaseException | None:
        return self._error

    def should_commit(self) -> bool:
        """True if every collective of this step succeeded on this member: apply the
        update now. The committed step count (and samples consumed) go up."""
        ok = self._in_step and self._error is None and self.group is not None
        self._in_step = False
        if ok:
            self.step += 1
            self._commit_round = self._round if self._round is not None else -1
            if self._sampler is not None:
                self.samples += self._sampler.global_batch
        return ok

    # ------------------------------------------------------------------ collectives

    def allreduce(self, buf: Any, op: ReduceOp | str = ReduceOp.SUM) -> bool:
        """all_reduce over the current group; a failure is recorded (the step will not
        commit) instead of raised. Returns whether it succeeded."""
        if self._error is not None or self.group is None:
            return False
        try:
            _coll.all_reduce(buf, op=op, group=self.group)
            return True
        except CollectiveError as exc:
            self.report_error(exc)
            return False

    def average(self, buffers: Sequence[Any]) -> bool:
        """Average gradients (numpy arrays, CPU torch tensors: anything numpy can view,
        modified in place) over the members, in one flat all_reduce per dtype. Each
        member's part is weighted by its share of the step's global batch (ElasticSampler),
        else by 1/size, so the result is the mean over the samples the step used. The
        flag that a newcomer waits rides along as one more element, so noticing joiners
        costs no collective of its own. A failure is recorded (see should_commit)."""
        if self._error is not None or self.group is None:
            return False
        weight = self._sampler.share() if self._sampler is not None else 1.0 / self.size
        views = [b if isinstance(b, np.ndarray) else np.asarray(b) for b in buffers]
        layout = tuple((v.dtype, v.size, v.flags.c_contiguous) for v in views)
        plan = self._flat.get(layout)
        if plan is None:  # made once per layout: the same gradients every step cost nothing
            plan = self._flat[layout] = flat_plan(layout)
        flag = 1.0 if self.is_leader() and self._leader_sees_joiner() else 0.0
        for n, (flat, total, parts) in enumerate(plan):
            for i, at, size in parts:
                flat[at : at + size] = views[i].reshape(-1)
            if weight != 1.0:
                np.multiply(flat[:total], weight, out=flat[:total], casting="unsafe")
            flat[total] = flag if n == 0 else 0
            if not self.allreduce(flat, ReduceOp.SUM):
                return False
            if n == 0:
                self._pending = bool(flat[total] > 0)
                self._carried = True
            for i, at, size in parts:
                views[i].reshape(-1)[:] = flat[at : at + size]  # contiguous: a view
        return True

    # ------------------------------------------------------------------ leaving

    def finish(self) -> None:
        """After the last step: agree with the other members that every one of them holds
        the same committed state (a member whose last step failed receives it now), so
        that none leaves while another would still need it. Bounded like every round."""
        deadline = time.monotonic() + self._bound()
        while not self._closed:
            if self.group is not None and self._error is None:
                mine = np.array([self.step], np.int64)
                got = np.zeros(self.size, np.int64)
                try:
                    _coll.all_gather_into_tensor(got, mine, group=self.group)
                    if int(got.min()) == int(got.max()) == self.step:
                        break
                    self._error = ElasticError(f"members disagree on the final step: {got}")
                except CollectiveError as exc:
                    self._error = exc
            if time.monotonic() > deadline:
                raise ElasticError("the members did not agree on the final step in time")
            self._reconfigure()
            self._error = None
        try:
            self._store.set(f"{self._prefix}/done", str(self.step))
        except StoreError:
            pass

    def close(self) -> None:
        """Leave the job: close the group, end the lease, close the store (if ours)."""
        if self._closed:
            return
        self._closed = True
        self._close_world()
        for store in (self._lease_store, self._store if self._owns_store else None):
            if store is not None:
                try:
                    store.close()
                except (OSError, StoreError):
                    pass

    def __enter__(self) -> Manager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _bound(self) -> float:
        return self.join_timeout + 2 * self.setup_timeout + self.timeout

    def _lease_key(self, uid: str) -> str:
        return f"{self._prefix}/lease/{uid}"

    def _key(self, *parts: object) -> str:
        return "/".join([self._prefix, *map(str, parts)])

    def _alive(self, uid: str) -> bool:
        return self._store.check([self._lease_key(uid)])

    def _leader_sees_joiner(self) -> bool:
        """Whether a newcomer registered for the next round, as the leader's watcher last
        saw it (a flag: the step itself never waits on the store)."""
        return self._round is not None and self._joiner_seen == self._round

    def _watch_round(self) -> None:
        """On etcd, every member: a thread that watches the job's keys for the round's
        life. A member's lease that ends (its process died, or its host vanished: no
        socket closes then, only the lease's TTL runs out) interrupts this group, so a
        collective blocked on that member fails now, not at its timeout; a newcomer's
        registration raises the joiner flag (the leader's is the one that counts). Off the
        step's path; a quiet watch costs nothing."""
        store = self._store
        assert isinstance(store, EtcdStore)
        round_, world = self._round, self._world
        assert round_ is not None  # called within a round
        others = set(self._members) - {self.uid}
        leases = self._key("lease") + "/"
        joiner = self._key("round", round_ + 1, "n")
        after = self._formed_at

        def watch() -> None:
            nonlocal after
            try:  # a newcomer that registered before `after` is seen here, later ones below
                if store.check([joiner]):
                    self._joiner_seen = round_
            except StoreError as exc:
                self._warn_store(exc)
            while not self._closed and self._round == round_:
                try:
                    # in pieces of _WATCH_PIECE s, so that the thread of a round gone ends
                    for kind, key, _, rev in store.watch_prefix(
                        self._prefix + "/", after, time.monotonic() + _WATCH_PIECE
                    ):
                        after = max(after, rev)
                        if self._round != round_:
                            return
                        uid = key[len(leases) :] if key.startswith(leases) else None
                        if kind == "DELETE" and uid in others and world is not None:
                            log.info("elastic: member %s's lease ended: leaving round %d",
                                     uid, round_)  # fmt: skip
                            transport = world.transport
                            if transport is not None:
                                transport.interrupt(
                                    f"member {uid}'s etcd lease ended (its process died or "
                                    "its host was cut off)"
                                )
                        elif kind == "PUT" and key == joiner:
                            self._joiner_seen = round_
                except StoreError as exc:
                    if not self._closed:
                        self._warn_store(exc)
                    time.sleep(0.5)

        threading.Thread(target=watch, name="pycollective-elastic-watch", daemon=True).start()

    def _watch_for_joiners(self) -> None:
        """On the leader: a thread that looks in the store every _JOIN_POLL seconds for a
        newcomer registered for the round after this one, and raises the flag. Off the
        step's path, so the other members never wait in the all_reduce for the leader's
        round trip to the store. It ends with the round (or the manager)."""
        round_ = self._round
        assert round_ is not None  # called within a round
        key = self._key("round", round_ + 1, "n")

        def watch() -> None:
            while not self._closed and self._round == round_:
                try:
                    if self._store.check([key]):
                        self._joiner_seen = round_
                        return
                except StoreError as exc:
                    if not self._closed:
                        self._warn_store(exc)
                    return
                time.sleep(_JOIN_POLL)

        threading.Thread(target=watch, name="pycollective-elastic-watch", daemon=True).start()

    def _warn_store(self, exc: BaseException) -> None:
        if not self._store_warned:  # said even when the program configured no logging
            self._store_warned = True
            warnings.warn(
                f"elastic: the store is unreachable ({exc}); training goes on, but no "
                "member can join, and the next membership change will fail",
                RuntimeWarning, stacklevel=2,
            )  # fmt: skip

    def _joiner_waits(self) -> bool:
        """Whether to remake the group now (every member computes the same)."""
        if self._carried:
            return self._pending
        flag = np.array([1 if self.is_leader() and self._leader_sees_joiner() else 0], np.int64)
        try:
            _coll.all_reduce(flag, op=ReduceOp.MAX, group=self.group)
        except CollectiveError as exc:
            self._error = exc
            return True
        return bool(flag[0])

    def _close_world(self) -> None:
        world, self._world, self.group = self._world, None, None
        self._close(world)

    def _close(self, world: World | None) -> None:
        if world is not None and not world.closed:
            try:
                rendezvous.close_world(world)
            except (CollectiveError, OSError) as exc:
                log.debug("elastic: closing the old group: %s", exc)

    def _poisoned(self) -> str | None:
        key = self._key("failed")
        if self._store.check([key]):
            return self._store.get(key).decode("utf-8", "replace")
        return None

    def _latest(self) -> int:
        key = self._key("latest")
        return int(self._store.get(key)) if self._store.check([key]) else -1

    def _set_latest(self, t: int) -> None:
        key = self._key("latest")
        for _ in range(100):  # raced by a later round only: then it is already higher
            current = self._store.get(key) if self._store.check([key]) else b""
            if current and int(current) >= t:
                return
            if self._store.compare_set(key, current, str(t)) == str(t).encode():
                return

    def _reconfigure(self) -> None:
        """Leave the old group and settle into a new one (bounded; raises ElasticError)."""
        started, t0 = time.time(), time.monotonic()
        failure = self._store.failure if isinstance(self._store, EtcdStore) else None
        if failure is not None:
            self._close_world()
            raise ElasticError(f"the elastic job cannot go on: {failure}")
        deadline = t0 + self._bound()
        reason = f"{type(self._error).__name__}: {self._error}" if self._error else "join"
        old = list(self._members)
        # Who closed their connections to us. A member leaving a group registers for the
        # next round *before* it closes its connections (_decide), so a connection its
        # peer closed means that peer registered or died: the round need not wait for its
        # lease to run out (on etcd, a TTL of seconds) to tell which. The old group is
        # closed only once this member registered, for the same reason.
        leaving = (self._world, list(self._members))
        closed = self._peers_closed(*leaving)
        closed_for = self._round + 1 if self._round is not None else None
        self._world, self.group = None, None  # closed once registered (_decide)
        t = self._round + 1 if self._round is not None else self._latest() + 1
        try:
            while True:
                poison = self._poisoned()
                if poison is not None:
                    raise ElasticError(f"the elastic job failed: {poison}")
                if self._finished():
                    raise JobFinished("the elastic job finished before this member could join")
                if time.monotonic() > deadline:
                    raise ElasticError(f"no new group formed within {self._bound():g} s")
                if t != closed_for:
                    self._close(leaving[0])
                    closed, leaving = [], (None, [])
                decision = self._decide(t, deadline, closed, leaving)
                leaving = (None, [])
                if decision.failed:
                    self._store.compare_set(self._key("failed"), "", decision.failed)
                    raise ElasticError(decision.failed)
                if self.uid not in decision.uids:
                    t += 1  # decided without us (we came late): ask the next round
                    continue
                try:
                    received = self._form(decision)
                except (CollectiveError, OSError) as exc:
                    log.info("elastic: round %d did not form (%s); trying the next", t, exc)
                    leaving = (self._world, decision.uids)  # closed after the registration
                    closed = self._peers_closed(*leaving)
                    self._world, self.group = None, None
                    self._round, self._members = t, decision.uids
                    t += 1
                    closed_for = t
                    continue
                now = set(decision.uids)
                event = Event(
                    t, decision.uids, self.rank, sorted(set(old) - now), sorted(now - set(old)),
                    self.step, received, started, time.monotonic() - t0, reason,
                )  # fmt: skip
                self.events.append(event)
                log.info("elastic: round %d: %d members, rank %d, step %d (%.3f s)",
                         t, len(now), self.rank, self.step, event.seconds)  # fmt: skip
                return
        finally:
            self._close(leaving[0])  # an error on the way: still closed

    def _peers_closed(self, world: World | None, uids: list[str]) -> list[str]:
        """The members of the group being left (`world`, `uids` in its rank order) whose
        end of their connection to this member is closed."""
        transport = getattr(world, "transport", None)
        transport = getattr(transport, "inner", transport)  # under a CountingTransport
        ask = getattr(transport, "peers_closed", None)
        if ask is None:
            return []
        try:
            ranks = ask()
        except OSError:
            return []
        return [uids[r] for r in ranks if 0 <= r < len(uids) and uids[r] != self.uid]

    def _pause(self, decision_key: str, since: int) -> None:
        """Until something changes in the job's keys after revision `since` (etcd: a
        watch), or a short while."""
        if isinstance(self._store, EtcdStore):
            try:
                wait_for_change(self._store, self._prefix + "/", since, 0.5)
            except StoreError:
                time.sleep(0.05)  # the next reads say what is wrong
            return
        try:  # sleeps until the decision is set, or _POLL
            self._store.wait([decision_key], _POLL)
        except StoreError:
            pass

    def _finished(self) -> bool:
        return self._fresh and self._store.check([self._key("done")])

    def _decide(
        self,
        t: int,
        deadline: float,
        closed: Sequence[str] = (),
        leaving: tuple[World | None, list[str]] = (None, []),
    ) -> Decision:
        """Register for round t and wait for its decision (deciding it when ours to).
        `closed`: the members of round t - 1 whose connections to us closed; `leaving`:
        the group of round t - 1 and its members, closed once we registered, or (a
        decider that may still learn who closed) once the round is decided."""
        try:
            return self._register_and_decide(t, deadline, closed, leaving)
        finally:
            self._close(leaving[0])

    def _register_and_decide(
        self,
        t: int,
        deadline: float,
        closed: Sequence[str],
        leaving: tuple[World | None, list[str]],
    ) -> Decision:
        me = Registration(
            self.uid,
            self.step,
            self._fresh,
            socket.gethostname(),
            os.getpid(),
            self._order,
            self._commit_round,
            tuple(closed),
        )
        i = self._store.add(self._key("round", t, "n"), 1)
        self._store.set(self._key("round", t, "reg", i), json.dumps(me.to_json()))
        decision_key = self._key("round", t, "decision")
        previous = self._previous(t)
        if previous is None or self.uid not in previous:
            self._close(leaving[0])  # not a decider: nothing more to learn from it
            leaving = (None, [])
        regs: dict[int, Registration] = {}
        joined_at = time.monotonic()
        # A newcomer waits as long as a step may take; a member, the join timeout.
        wait = self.join_timeout if previous is None or self.uid in previous else self.timeout
        while True:
            since = self._store.revision if isinstance(self._store, EtcdStore) else 0
            if self._store.check([decision_key]):
                return Decision.from_json(json.loads(self._store.get(decision_key)))
            may_decide = previous is None or self.uid in previous
            if may_decide:
                n = int(self._store.get(self._key("round", t, "n")))
                for j in range(1, n + 1):
                    key = self._key("round", t, "reg", j)
                    if j not in regs and self._store.check([key]):
                        regs[j] = Registration.from_json(json.loads(self._store.get(key)))
                listed = [regs[j] for j in sorted(regs)]
                # what this member sees closing while it waits counts too: a member of the
                # lost host whose socket the kernel had not closed yet at our first look
                mine = self._peers_closed(*leaving)
                accused = self._accused(t, listed, previous, regs, mine)
                listed = [regs[j] for j in sorted(regs)]
                watch = ({r.uid for r in listed} | set(previous or [])) - {self.uid}
                dead = self._dead(watch) | accused
                timed_out = time.monotonic() - joined_at > wait
                d = decide(
                    t, self.uid, previous, listed, dead, timed_out,
                    min_size=self.min_size, max_size=self.max_size, initial=self.initial_size,
                    held=self._store.check([self._key("held")]),
                )  # fmt: skip
                if d is not None:
                    won = self._store.compare_set(decision_key, "", json.dumps(d.to_json()))
                    if won == json.dumps(d.to_json()).encode() and not d.failed:
                        log.info("elastic: round %d decided here, %.3f s after registering: "
                                 "%d members; gone by lease %s, by closed connections %s",
                                 t, time.monotonic() - joined_at, len(d.members),
                                 sorted(dead - accused), sorted(accused))  # fmt: skip
                    continue  # read back whichever decision won
            elif self._finished():
                raise JobFinished("the elastic job finished before this member could join")
            elif time.monotonic() - joined_at > wait:
                raise ElasticError(f"no member let this one join within {wait:g} s (round {t})")
            poison = self._poisoned()
            if poison is not None:
                raise ElasticError(f"the elastic job failed: {poison}")
            if time.monotonic() > deadline:
                raise ElasticError(f"round {t} was not decided in time")
            self._pause(decision_key, since)

    def _accused(
        self,
        t: int,
        listed: list[Registration],
        previous: list[str] | None,
        regs: dict[int, Registration],
        mine: Sequence[str] = (),
    ) -> set[str]:
        """Members of round t - 1 that a registered member of it saw close their
        connections and that have not registered: dead (see _reconfigure). Before that
        is concluded every slot is read again, after the accuser's: a member that
        registered before it closed shows there now (the store is linearizable)."""
        if not previous:
            return set()
        members = set(previous)
        accused = ({u for r in listed if r.uid in members for u in r.closed} | set(mine)) & members
        accused -= {r.uid for r in listed} | {self.uid}
        if accused:
            n = int(self._store.get(self._key("round", t, "n")))
            for j in range(1, n + 1):
                key = self._key("round", t, "reg", j)
                if j not in regs and self._store.check([key]):
                    regs[j] = Registration.from_json(json.loads(self._store.get(key)))
            accused -= {r.uid for r in regs.values()}
        return accused

    def _dead(self, uids: set[str]) -> set[str]:
        """The members among `uids` whose lease ended (one request when all are alive)."""
        if not uids or self._store.check([self._lease_key(u) for u in uids]):
            return set()
        return {u for u in uids if not self._alive(u)}

    def _previous(self, t: int) -> list[str] | None:
        if t == 0:
            return None
        if self._round == t - 1 and self._members:
            return list(self._members)
        key = self._key("round", t - 1, "decision")
        if not self._store.check([key]):
            return None if t == 0 else []
        return Decision.from_json(json.loads(self._store.get(key))).uids

    def _form(self, decision: Decision) -> bool:
        """Connect the decided members and bring everyone to the donor's state."""
        t = decision.round
        uids = decision.uids
        rank = uids.index(self.uid)
        size = len(uids)
        leases = {u: self._lease_key(u) for u in uids if u != self.uid}
        # the round's watch (etcd) starts here: a lease that ends while the group forms
        # is seen by it too, whatever the set-up read after
        self._formed_at = self._store.revision if isinstance(self._store, EtcdStore) else 0
        store = WatchedStore(self._store, leases, time.monotonic() + self.setup_timeout,
                              self._prefix + "/")  # fmt: skip
        world = rendezvous.connect_world(
            rank, size, store, self.setup_timeout, self._key("round", t, "mesh"),
            master_addr=self._master_addr, multi_node=self._multi_node, abort=store.gone,
        )  # fmt: skip
        self._world = world
        # A new id per round: no frame of an earlier group can pass for one of this group.
        gid = zlib.crc32(f"{self._prefix}/round/{t}".encode()) or 1
        group = ProcessGroup(world, tuple(range(size)), gid, f"elastic#{t}", self.timeout)
        self.group = group
        received = False
        if decision.behind:
            donor = uids.index(decision.donor)
            behind = [uids.index(u) for u in decision.behind]
            # Sealed with the job's key, sized and bounded (api/objects.py); pickled only
            # with PYCOLLECTIVE_OBJECT_SERIALIZER=pickle, else the pickle-free format.
            if rank == donor:
                state = self._full_state()
                for b in behind:
                    _objects.send_object(state, b, group, internal=True)
            elif rank in behind:
                self._apply_state(_objects.recv_object(donor, group, internal=True))
                received = True
        self._round, self._members, self._fresh = t, uids, False
        if isinstance(self._store, EtcdStore):
            self._watch_round()
        elif rank == 0:
            self._watch_for_joiners()
        try:
            self._set_latest(t)
            if t == 0 or not self._store.check([self._key("held")]):
                self._store.set(self._key("held"), "1")  # from now on a holder is needed
        except StoreError:
            pass
        return received

    def _full_state(self) -> dict[str, Any]:
        user = self._state_dict() if self._state_dict is not None else None
        return {"step": self.step, "commit_round": self._commit_round,
                "samples": self.samples, "user": user}  # fmt: skip

    def _apply_state(self, state: dict[str, Any]) -> None:
        if self._load_state_dict is not None and state["user"] is not None:
            self._load_state_dict(state["user"])
        self.step = int(state["step"])
        self._commit_round = int(state["commit_round"])
        self.samples = int(state["samples"])


__all__ = ["Event", "Manager"]
