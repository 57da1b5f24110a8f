"""EtcdStore: the rendezvous store on an etcd cluster (v3 API), so that no host of the
job is the store's single point of failure (init_method="etcd://h1:2379,h2:2379/job").

What it builds on, and why:

- **Transactions on revisions.** `add` and `compare_set` read the key, then write it in a
  transaction that succeeds only if the key's mod_revision is still the one read (or it
  is still absent); a lost race reads again. No lock is held anywhere, so a client that
  stops or dies in the middle leaves nothing locked.
- **Watches for waits.** `get` and `wait` read; a missing key is then watched from the
  revision after that read, so a put in between is never missed and nothing polls.
- **Leases for liveness and for the job's lifetime.** Every key of the job is attached to
  one etcd lease, the job's incarnation, which every open store keeps alive: when the last
  one closes (a count in the store) the lease is revoked and the job's keys vanish with it;
  when every client died, they vanish `job_ttl` seconds later. So a job started again
  under the same name never reads an earlier run's keys. `set_lease` attaches a key to
  this client's own lease instead (TTL `lease_ttl`): a liveness lease that ends when the
  process dies or its host vanishes, within the TTL.
- **Signed values.** etcd does not know the job's secret: every value carries an HMAC
  under a key derived from it (store/_signed.py), over the key name, the lease and the
  value, checked on every read; a forged or unsigned value raises StoreError naming the
  key. That keeps out forged membership and addresses; deleting keys (a denial of
  service) is kept out only by etcd's own authentication and TLS, passed through here.

Several endpoints are tried in turn (store/_etcd_client.py); when none answers, the
error says whether the cluster lost its quorum.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from .. import _config, _files, _keys
from .._errors import StoreError, UsageError
from . import _signed
from ._base import (
    Store,
    Timeout,
    add_to_counter,
    check_keys,
    compare_set_result,
    encode_key,
    encode_value,
    timeout_error,
)
from ._etcd_client import (
    Endpoint,
    EtcdAuth,
    EtcdClient,
    EtcdError,
    b64,
    parse_endpoints,
    prefix_end,
    unb64,
)

R = TypeVar("R")  # what a read-modify-write step returns (_update)

logger = logging.getLogger("pycollective.store")

ROOT = "pycollective"
_TXN_OPS = 100  # etcd's default --max-txn-ops is 128
# answers that no retry will change: etcd's auth or TLS refused us
_REFUSALS = ("TLS", "auth", "user name is empty", "permission denied", "authentication failed")


def _rev(answer: dict) -> int:
    return int((answer.get("header") or {}).get("revision", 0))


class EtcdStore(Store):
    """A store in the etcd cluster at `endpoints` ("h1:2379,h2:2379" or a list), under
    the job name `job` (keys live under "pycollective/<job>/" in etcd).

    `secret=None` reads the job's secret from the environment (values are signed with
    it). `auth` carries etcd's own TLS and user/password (default: from the environment,
    PYCOLLECTIVE_ETCD_CACERT and the rest). Opening joins the job's incarnation within
    `connect_timeout` (default: `timeout`)."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        job: str = "default",
        secret: bytes | str | _keys.JobKey | None = None,
        timeout: Timeout = 300.0,
        connect_timeout: Timeout = None,
        *,
        auth: EtcdAuth | None = None,
        request_timeout: float = 5.0,
        job_ttl: int = 10,
        lease_ttl: int = 2,
    ) -> None:
        super().__init__(timeout)
        if not job or "\0" in job:
            raise UsageError(f"etcd job name must be a non-empty string, got {job!r}")
        self._auth = auth if auth is not None else auth_from_env()
        self.endpoints: list[Endpoint] = parse_endpoints(endpoints, tls=self._auth.tls)
        self.job = job.strip("/")
        # the job's key (None: PYCOLLECTIVE_SECRET, _SECRET_FILE or the per-user key file);
        # values are signed with a key derived from it for this use alone
        self._mac_key = _signed.derive_key(_keys.as_key(secret, "the etcd store's secret"))
        self._root = f"{ROOT}/{self.job}/".encode()
        self._user = self._root + b"k/"
        self._incarnation = self._root + b"m/incarnation"
        self._users = self._root + b"m/users"
        self.job_ttl = int(job_ttl)
        self.lease_ttl = int(lease_ttl)
        self._client = EtcdClient(self.endpoints, self._auth, request_timeout=request_timeout)
        self._tls = threading.local()
        self._job_lease = 0
        self._session_lease = 0
        self._session_ttl = 0
        self._lock = threading.Lock()
        self._closed = False  # close() began
        self._shut = False  # close() ended: no request any more
        self._stop = threading.Event()
        self._kick = threading.Event()  # set_lease made a shorter lease: renew on its clock
        self._failure: str | None = None
        self._quorum_lost: str | None = None  # until the cluster has a leader again
        self._no_leader_since: float | None = None
        self._keeper: threading.Thread | None = None
        budget = self.timeout if connect_timeout is None else Store._resolve(self, connect_timeout)
        try:
            if self._auth.user:
                self._client.authenticate()
            self._join(60.0 if budget is None else budget)
        except BaseException:
            self._client.close()
            raise
        self._keeper = threading.Thread(target=self._keep_alive, name="pycollective-etcd-lease",
                                        daemon=True)  # fmt: skip
        self._keeper.start()

    # ------------------------------------------------------------------ what callers read

    @property
    def where(self) -> str:
        return f"etcd at {','.join(map(str, self.endpoints))} (job {self.job!r})"

    @property
    def revision(self) -> int:
        """The highest etcd revision this thread has read: a watch from revision + 1 sees
        every change after what this thread saw."""
        return getattr(self._tls, "rev", 0)

    @property
    def failure(self) -> str | None:
        """Why this store cannot be relied on any more (the cluster has had no leader for
        longer than `lease_ttl` twice over, or this client's lease expired), else None."""
        return self._failure

    def full_key(self, key: str) -> str:
        """The etcd key that store key `key` is kept under."""
        return (self._user + encode_key(key)).decode()

    def __repr__(self) -> str:
        return f"EtcdStore({','.join(map(str, self.endpoints))!r}, job={self.job!r})"

    # ------------------------------------------------------------------ low level

    def _call(
        self, path: str, body: dict, budget: float | None = None, attempt: float | None = None
    ) -> dict:
        if self._shut:
            raise StoreError(f"{self.where}: the store is closed")
        if self._quorum_lost is not None:
            # said once by the lease thread, at once to every caller since: a rank on its
            # way into a new round names the lost quorum now, not after a request's budget
            raise StoreError(self._quorum_lost)
        answer = self._client.call(path, body, budget, attempt, lambda: self._quorum_lost)
        rev = _rev(answer)
        if rev > getattr(self._tls, "rev", 0):
            self._tls.rev = rev
        return answer

    def _seal(self, name: bytes, value: bytes, lease: int) -> bytes:
        return _signed.seal(self._mac_key, name, value, lease)

    def _open(self, kv: dict) -> bytes:
        name = unb64(kv.get("key"))
        shown = name[len(self._user) :].decode("utf-8", "replace") if name.startswith(
            self._user) else name.decode("utf-8", "replace")  # fmt: skip
        return _signed.open_sealed(self._mac_key, name, unb64(kv.get("value")),
                                   int(kv.get("lease", 0)), shown)  # fmt: skip

    def _range(self, name: bytes) -> tuple[bytes | None, dict | None]:
        kvs = self._call("kv/range", {"key": b64(name)}).get("kvs") or []
        if not kvs:
            return None, None
        return self._open(kvs[0]), kvs[0]

    def _ranges(self, names: Sequence[bytes]) -> dict[bytes, bytes]:
        """The present keys among `names`, read at one revision per batch."""
        found: dict[bytes, bytes] = {}
        for at in range(0, len(names), _TXN_OPS):
            batch = names[at : at + _TXN_OPS]
            ops = [{"request_range": {"key": b64(n)}} for n in batch]
            answer = self._call("kv/txn", {"success": ops})
            for resp in answer.get("responses") or []:
                for kv in (resp.get("response_range") or {}).get("kvs") or []:
                    found[unb64(kv["key"])] = self._open(kv)
        return found

    def _put_if(self, name: bytes, kv: dict | None, envelope: bytes, lease: int) -> bool:
        """Put `envelope` if `name` is unchanged since `kv` was read (absent: kv None).

        A request that got no answer, or was retried on another member after one, may
        have landed all the same: the nonce in the key's value says whether the write
        there now is ours, so a counter is never incremented twice."""
        if kv is None:
            cmp = {"key": b64(name), "target": "CREATE", "create_revision": "0",
                   "result": "EQUAL"}  # fmt: skip
        else:
            cmp = {"key": b64(name), "target": "MOD", "mod_revision": kv["mod_revision"],
                   "result": "EQUAL"}  # fmt: skip
        put: dict[str, Any] = {"key": b64(name), "value": b64(envelope)}
        if lease:
            put["lease"] = str(lease)
        body = {"compare": [cmp], "success": [{"request_put": put}],
                "failure": [{"request_range": {"key": b64(name)}}]}  # fmt: skip
        mine = _signed.nonce_of(envelope)
        try:
            answer = self._call("kv/txn", body)
        except EtcdError as exc:
            if exc.code is not None:
                raise  # refused: nothing was written
            _, now = self._range(name)
            return now is not None and _signed.nonce_of(unb64(now.get("value"))) == mine
        if answer.get("succeeded"):
            return True
        for resp in answer.get("responses") or []:
            for now in (resp.get("response_range") or {}).get("kvs") or []:
                if _signed.nonce_of(unb64(now.get("value"))) == mine:
                    return True  # an earlier attempt of this very request landed
        return False

    def _update(
        self, name: bytes, shown: str, change: Callable[[bytes | None], tuple[R, bytes | None]]
    ) -> tuple[R, bytes | None]:
        """Read-modify-write `name` as a transaction on its revision, retried when another
        writer got there first. `change(current) -> (result, new value or None)`."""
        while True:
            current, kv = self._range(name)
            result, new = change(current)
            if new is None:
                return result, current
            if self._put_if(name, kv, self._seal(name, new, self._job_lease), self._job_lease):
                return result, new

    def _watch(self, name: bytes, end: bytes | None, after: int, deadline: float | None
               ) -> Iterator[list[dict]]:  # fmt: skip
        return self._client.watch(name, end, after + 1, deadline)

    # ------------------------------------------------------------------ the job's lease

    def _grant(self, ttl: int) -> tuple[int, int]:
        answer = self._call("lease/grant", {"TTL": str(ttl)})
        return int(answer["ID"]), int(answer.get("TTL", ttl))

    def _keepalive_once(self, lease: int, ttl: float) -> int:
        """The lease's TTL after renewing it; 0 if it no longer exists. Each member gets a
        third of the TTL (a member cut off must not hold the renewal up until it expires)."""
        answer = self._client.call("lease/keepalive", {"ID": str(lease)}, budget=ttl / 2,
                            attempt=max(0.2, ttl / 6))  # fmt: skip
        return int((answer.get("result") or {}).get("TTL", 0))

    def _revoke(self, lease: int) -> None:
        try:
            self._client.call("lease/revoke", {"ID": str(lease)}, 2.0)
        except EtcdError as exc:
            logger.debug("revoking etcd lease %x: %s", lease, exc)

    def _join(self, budget: float) -> None:
        """Join the job's incarnation (make it if none is alive) and count ourselves in."""
        deadline = time.monotonic() + budget
        last: Exception | None = None
        while True:
            if time.monotonic() > deadline:
                raise StoreError(f"could not reach {self.where} within {budget:g} s: {last}")
            try:
                if self._join_once():
                    break
            except EtcdError as exc:
                text = str(exc)
                if exc.code in (-1, 7, 16) or any(w in text for w in _REFUSALS):
                    raise StoreError(f"could not reach {self.where}: {exc}") from None
                last = exc
                time.sleep(0.2)
        self._update(self._users, "users", lambda cur: (None, str(
            add_to_counter(cur, "users", 1)).encode()))  # fmt: skip

    def _join_once(self) -> bool:
        envelope_kv = self._call("kv/range", {"key": b64(self._incarnation)}).get("kvs") or []
        if envelope_kv:
            kv = envelope_kv[0]
            self._open(kv)  # a forged incarnation is refused, naming the key
            lease = int(kv.get("lease", 0))
            if lease and self._keepalive_once(lease, self.job_ttl) > 0:
                self._job_lease = lease
                return True
            # its lease is gone (the last client of an earlier run died): clear it
            same = {"key": kv["key"], "target": "MOD", "mod_revision": kv["mod_revision"],
                    "result": "EQUAL"}  # fmt: skip
            delete = {"request_delete_range": {"key": kv["key"]}}
            self._call("kv/txn", {"compare": [same], "success": [delete]})
            return False
        lease, _ = self._grant(self.job_ttl)
        who = f"{socket.gethostname()}:{os.getpid()}".encode()
        if self._put_if(self._incarnation, None, self._seal(self._incarnation, who, lease), lease):
            self._job_lease = lease
            return True
        self._revoke(lease)
        return False

    def _keep_alive(self) -> None:
        """Renew the job's lease and ours, a third of the shortest TTL apart. If the
        cluster has no leader for long (its quorum is lost) or our lease expired, say so
        in `failure` (the elastic manager raises on it)."""
        while not self._stop.is_set():
            ttl = min(self.job_ttl, self._session_ttl or self.job_ttl)
            if self._kick.wait(max(0.2, ttl / 3)):
                self._kick.clear()
                continue  # a new lease: start again with its TTL
            if self._stop.is_set():
                return
            try:
                # ours first: it is the shorter, and its loss is the one that matters
                if self._session_lease and self._keepalive_once(self._session_lease, ttl) <= 0:
                    self._failure = (f"this process's etcd lease expired (it was cut off from "
                                     f"{self.where} for longer than its TTL)")  # fmt: skip
                if self._keepalive_once(self._job_lease, ttl) <= 0:
                    logger.warning("%s: the job's lease expired", self.where)
                self._no_leader_since = None
                self._quorum_lost = None
            except EtcdError as exc:
                now = time.monotonic()
                if self._no_leader_since is None:
                    self._no_leader_since = now
                leader = self._client.has_leader()
                if leader:
                    self._no_leader_since = None
                elif now - self._no_leader_since > max(5.0, 2 * (self._session_ttl or 2)):
                    self._failure = (f"lost the etcd quorum: {self.where} has had no leader for "
                                     f"{now - self._no_leader_since:.1f} s ({exc})")  # fmt: skip
                    self._quorum_lost = self._failure

    # ------------------------------------------------------------------ the Store API

    def set(self, key: str, value: bytes | str) -> None:
        name = self._user + encode_key(key)
        envelope = self._seal(name, encode_value(value), self._job_lease)
        self._call("kv/put", {"key": b64(name), "value": b64(envelope),
                              "lease": str(self._job_lease)})  # fmt: skip

    def set_lease(self, key: str, value: bytes | str) -> None:
        """Set `key` on this client's own lease (TTL `lease_ttl`, renewed while the
        process lives): it vanishes when the store is closed, or within the TTL when the
        process dies or its host is cut off. A liveness lease, as TCPStore.set_lease."""
        with self._lock:
            if not self._session_lease:
                self._session_lease, self._session_ttl = self._grant(self.lease_ttl)
                self._kick.set()
        name = self._user + encode_key(key)
        envelope = self._seal(name, encode_value(value), self._session_lease)
        self._call("kv/put", {"key": b64(name), "value": b64(envelope),
                              "lease": str(self._session_lease)})  # fmt: skip

    @property
    def session_ttl(self) -> int:
        """The TTL etcd granted this client's own lease (0 before set_lease)."""
        return self._session_ttl

    def get(self, key: str, timeout: Timeout = None) -> bytes:
        name = self._user + encode_key(key)
        seconds = self._resolve(timeout)
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            value, _ = self._range(name)  # the one read: watching from its revision is safe
            if value is not None:
                return value
            for events in self._watch(name, None, self.revision, deadline):
                for e in events:
                    if e.get("type", "PUT") == "PUT":
                        return self._open(e["kv"])
            if deadline is not None and time.monotonic() >= deadline:
                value, _ = self._range(name)  # the last word: it may have come just now
                if value is not None:
                    return value
                raise timeout_error([key], seconds, self.where)

    def add(self, key: str, amount: int) -> int:
        name = self._user + encode_key(key)
        amount = int(amount)

        def change(cur: bytes | None) -> tuple[int, bytes]:
            new = add_to_counter(cur, key, amount)
            return new, str(new).encode("ascii")

        return self._update(name, key, change)[0]

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        name = self._user + encode_key(key)
        e, d = encode_value(expected), encode_value(desired)

        def change(cur: bytes | None) -> tuple[bytes, bytes | None]:
            result, store = compare_set_result(cur, e, d)
            return result, d if store else None

        return self._update(name, key, change)[0]

    def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        names = check_keys(keys)
        seconds = self._resolve(timeout)
        deadline = None if seconds is None else time.monotonic() + seconds
        full = {self._user + encode_key(k): k for k in names}
        while True:
            since = self.revision  # before every read below: no change between them is missed
            found = self._ranges(list(full))
            missing = [n for n in full if n not in found]
            if not missing:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise timeout_error(names, seconds, self.where, [full[n] for n in missing])
            for events in self._watch(missing[0], None, since, deadline):
                if any(e.get("type", "PUT") == "PUT" for e in events):
                    break

    def check(self, keys: Sequence[str]) -> bool:
        names = [self._user + encode_key(k) for k in check_keys(keys)]
        return not names or len(self._ranges(names)) == len(set(names))

    def delete_key(self, key: str) -> bool:
        name = self._user + encode_key(key)
        return int(self._call("kv/deleterange", {"key": b64(name)}).get("deleted", 0)) > 0

    def num_keys(self) -> int:
        answer = self._call("kv/range", {"key": b64(self._user),
                                         "range_end": b64(prefix_end(self._user)),
                                         "count_only": True})  # fmt: skip
        return int(answer.get("count", 0))

    def watch_prefix(
        self, prefix: str, after: int, deadline: float | None = None
    ) -> Iterator[tuple[str, str, bytes | None, int]]:
        """(kind, key, value, revision) for each change of the keys under store key
        `prefix` after revision `after` (kind "PUT" with the checked value, or "DELETE"
        with None), until `deadline` (monotonic) or the caller stops iterating."""
        name = self._user + encode_key(prefix)
        for events in self._watch(name, prefix_end(name), after, deadline):
            for e in events:
                kv = e["kv"]
                key = unb64(kv["key"])[len(self._user) :].decode("utf-8", "replace")
                rev = int(kv.get("mod_revision", 0))
                if rev > getattr(self._tls, "rev", 0):
                    self._tls.rev = rev
                if e.get("type", "PUT") == "PUT":
                    yield "PUT", key, self._open(kv), rev
                else:
                    yield "DELETE", key, None, rev

    def close(self) -> None:
        """Leave the job: end our lease (our liveness keys vanish at once), count ourselves
        out, and the last one out revokes the job's lease (every key of the job goes)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._kick.set()
        try:
            if self._session_lease:
                self._revoke(self._session_lease)
            _, left = self._update(self._users, "users", lambda cur: (None, str(
                add_to_counter(cur, "users", -1)).encode()))  # fmt: skip
            if left is not None and int(left) <= 0:
                self._revoke(self._job_lease)
        except StoreError as exc:
            logger.debug("%s: leaving: %s", self.where, exc)
        finally:
            self._shut = True
            if self._keeper is not None and self._keeper is not threading.current_thread():
                self._keeper.join(timeout=self._client.request_timeout + 1)
            self._client.close()


def auth_from_env() -> EtcdAuth:
    """etcd's TLS and user from the settings PYCOLLECTIVE_ETCD_CACERT, _CERT, _KEY, _USER
    and _PASSWORD_FILE."""
    password = None
    path = _config.get("PYCOLLECTIVE_ETCD_PASSWORD_FILE")
    if path:
        try:  # a secret: this user's file, private, never through a link (_files)
            password = _files.read_private(path, 64 * 1024).decode("utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"PYCOLLECTIVE_ETCD_PASSWORD_FILE={path}: {exc}") from None
    return EtcdAuth(
        cacert=_config.get("PYCOLLECTIVE_ETCD_CACERT"),
        cert=_config.get("PYCOLLECTIVE_ETCD_CERT"),
        key=_config.get("PYCOLLECTIVE_ETCD_KEY"),
        user=_config.get("PYCOLLECTIVE_ETCD_USER"),
        password=password,
    )


def parse_url(url: str) -> tuple[str, str]:
    """ "etcd://h1:2379,h2:2379/job" -> ("h1:2379,h2:2379", "job"); "etcds://" is TLS."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("etcd", "etcds"):
        raise UsageError(f"{url!r} is not an etcd URL (etcd://HOST:PORT[,HOST:PORT...]/JOB)")
    hosts, _, job = rest.partition("/")
    job = job.split("?")[0].strip("/") or "default"
    if not hosts:
        raise UsageError(f"{url!r} names no etcd endpoint (etcd://HOST:PORT[,...]/JOB)")
    if scheme == "etcds":
        hosts = ",".join(h if "://" in h else f"https://{h}" for h in hosts.split(","))
    return hosts, job


__all__ = ["EtcdStore", "auth_from_env", "parse_url"]
