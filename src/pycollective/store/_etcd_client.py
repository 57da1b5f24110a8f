"""A small client of etcd's v3 API through its gRPC JSON gateway (etcd >= 3.4 serves it
on the client port at /v3/...), with the standard library only.

Why the gateway and no client package: the v3 API is gRPC, and the Python gRPC clients
(`etcd3` 0.12) break with protobuf >= 4 and pull in grpcio, tens of MB that torch jobs do
not otherwise need; `etcd3gw` speaks the same gateway as this module but brings
`requests`, `futurist` and `pbr`. What a rendezvous needs is a handful of calls (range,
txn, put, delete, lease grant/keepalive/revoke, watch, status), each one POST of JSON,
so it is written here: about 300 lines, no dependency, any protobuf.

Every request goes to one endpoint; on a connection failure, a timeout or an "unavailable"
answer (no leader, a member shutting down) the next endpoint is tried, in turn, within the
request's budget. Keys and values travel base64-encoded and int64 as decimal strings (the
gateway's JSON mapping). TLS (a CA, a client certificate) and etcd's user/password
authentication are etcd's own: they are passed through unchanged.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import StoreError
from ._etcd_endpoints import Endpoint, parse_endpoints

# Bound on one answer (a range of many keys, a watch event): anything larger is refused
# before it is read into memory (values are bounded by MAX_VALUE_BYTES, plus base64).
MAX_ANSWER_BYTES = 128 << 20
# gRPC codes that mean "this member cannot serve now, try another" (not "your request is
# wrong"): UNAVAILABLE, DEADLINE_EXCEEDED, and etcd's own "no leader"/"timed out" texts.
_RETRY_CODES = {4, 14}
_RETRY_TEXTS = ("no leader", "timed out", "leader changed", "stopped", "not capable")


class EtcdError(StoreError):
    """etcd answered with an error (a refused request), or no endpoint answered."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class EtcdAuth:
    """etcd's own security, passed through: a CA to verify the members (https), a client
    certificate and key (when etcd requires --client-cert-auth), a user and password
    (when etcd's auth is enabled)."""

    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = None

    @property
    def tls(self) -> bool:
        return bool(self.cacert or self.cert)

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.cacert)
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The range_end that makes a range cover every key starting with `prefix`."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


class EtcdClient:
    """POSTs of JSON to the gateway of one of `endpoints`, failing over in turn.

    Thread-safe: idle connections are pooled per endpoint; a watch has a connection of
    its own. `request_timeout` bounds one request on one endpoint, `connect_timeout` one
    connection attempt (a host that vanished answers nothing), `budget` a request over
    all endpoints in turn."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        auth: EtcdAuth | None = None,
        *,
        request_timeout: float = 2.0,
        connect_timeout: float = 1.0,
        budget: float = 8.0,
    ) -> None:
        self.endpoints = list(endpoints)
        self.budget = budget
        self.auth = auth or EtcdAuth()
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self._ssl = self.auth.context() if any(e.scheme == "https" for e in endpoints) else None
        self._lock = threading.Lock()
        self._idle: dict[Endpoint, list[http.client.HTTPConnection]] = {}
        self._current = 0  # the endpoint that answered last: tried first
        self._token: str | None = None
        self._closed = False

    def where(self) -> str:
        return "etcd at " + ",".join(map(str, self.endpoints))

    # ------------------------------------------------------------------ connections

    def _connect(self, ep: Endpoint, timeout: float) -> http.client.HTTPConnection:
        if ep.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                ep.host, ep.port, timeout=timeout, context=self._ssl
            )
        else:
            conn = http.client.HTTPConnection(ep.host, ep.port, timeout=timeout)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _take(self, ep: Endpoint) -> http.client.HTTPConnection | None:
        with self._lock:
            pool = self._idle.get(ep)
            return pool.pop() if pool else None

    def _give(self, ep: Endpoint, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.setdefault(ep, []).append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools, self._idle = self._idle, {}
        for pool in pools.values():
            for conn in pool:
                conn.close()

    def _order(self) -> list[Endpoint]:
        n = len(self.endpoints)
        return [self.endpoints[(self._current + i) % n] for i in range(n)]

    def _headers(self) -> dict[str, str]:
        # grpc-gateway passes Grpc-Metadata-* on as gRPC metadata: "hasleader" makes a
        # member that lost its leader refuse at once (and end our watches) rather than
        # serve stale answers or stall, so that we move on to a member that has one.
        headers = {"Content-Type": "application/json", "Grpc-Metadata-hasleader": "true"}
        if self._token:
            headers["Authorization"] = self._token
        return headers

    # ------------------------------------------------------------------ requests

    def call(
        self,
        path: str,
        body: dict[str, Any],
        budget: float | None = None,
        attempt: float | None = None,
        abandon: Callable[[], str | None] | None = None,
    ) -> dict:
        """POST `body` to /v3/`path` and return the answer; EtcdError when etcd refuses it
        or no endpoint answers within `budget` (default `self.budget`). One endpoint gets
        `attempt` seconds (default the request timeout) before the next is tried;
        `abandon()`, asked between attempts, may end the request with its reason."""
        budget = self.budget if budget is None else budget
        attempt = self.request_timeout if attempt is None else attempt
        deadline = time.monotonic() + budget
        data = json.dumps(body).encode()
        failures: list[str] = []
        reauth = bool(self.auth.user)
        while True:
            for i, ep in enumerate(self._order()):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                reason = abandon() if abandon is not None and failures else None
                if reason is not None:
                    raise EtcdError(reason)
                try:
                    answer = self._post(ep, path, data, min(left, attempt))
                except ssl.SSLError as exc:
                    # a certificate refused either way: no other member will think otherwise
                    raise EtcdError(f"{self.where()} refused us: TLS: {exc}", -1) from None
                except (OSError, http.client.HTTPException) as exc:
                    failures.append(f"{ep}: {exc or type(exc).__name__}")
                    continue
                error = _error_of(answer)
                if error is None:
                    if i:
                        self._current = self.endpoints.index(ep)
                    return answer
                text, code = error
                if reauth and ("token" in text or "user name is empty" in text):
                    reauth = False  # the token expired, or we have none yet: once more
                    self.authenticate()
                    return self.call(path, body, max(0.1, deadline - time.monotonic()))
                if code in _RETRY_CODES or any(t in text for t in _RETRY_TEXTS):
                    failures.append(f"{ep}: {text}")
                    continue
                raise EtcdError(f"{self.where()} refused {path}: {text}", code if code else -1)
            if time.monotonic() >= deadline:
                break
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        raise EtcdError(
            f"no member of {self.where()} answered {path} within {budget:g} s ("
            + "; ".join(_last_per_endpoint(failures))
            + ")"
            + self.diagnose()
        )

    def _post(self, ep: Endpoint, path: str, data: bytes, timeout: float) -> dict:
        conn = self._take(ep)
        fresh = conn is None
        if conn is None:
            conn = self._connect(ep, min(timeout, self.connect_timeout))
        try:
            conn.sock.settimeout(timeout)
            try:
                conn.request("POST", f"/v3/{path}", data, self._headers())
                resp = conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                if fresh:
                    raise
                conn.close()  # an idle connection the member closed: once more, fresh
                conn = self._connect(ep, min(timeout, self.connect_timeout))
                conn.sock.settimeout(timeout)
                conn.request("POST", f"/v3/{path}", data, self._headers())
                resp = conn.getresponse()
            length = resp.getheader("Content-Length")
            if length is not None and int(length) > MAX_ANSWER_BYTES:
                raise http.client.HTTPException(f"an answer of {length} bytes")
            raw = resp.read(MAX_ANSWER_BYTES + 1)
            if len(raw) > MAX_ANSWER_BYTES:
                raise http.client.HTTPException("an answer too large")
        except BaseException:
            conn.close()
            raise
        self._give(ep, conn)
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            raise http.client.HTTPException(f"not JSON (HTTP {resp.status})") from None
        if not isinstance(answer, dict):
            raise http.client.HTTPException(f"not a JSON object (HTTP {resp.status})")
        if resp.status != 200 and _error_of(answer) is None:
            answer = {"error": f"HTTP {resp.status}", "code": 14}
        return answer

    def authenticate(self) -> None:
        self._token = None
        body = {"name": self.auth.user, "password": self.auth.password or ""}
        answer = self.call("auth/authenticate", body)
        self._token = answer.get("token")

    def diagnose(self) -> str:
        """Why the cluster does not answer, from each member's status (served without a
        leader): "; the cluster has no leader (quorum lost?): ..." or ""."""
        seen, leaderless, down = [], [], []
        for ep in self.endpoints:
            try:
                status = self._post(ep, "maintenance/status", b"{}", min(1.0, self.request_timeout))
            except (OSError, http.client.HTTPException):
                down.append(str(ep))
                continue
            seen.append(str(ep))
            errors = status.get("errors") or []
            if not status.get("leader") or any("no leader" in e for e in errors):
                leaderless.append(str(ep))
        if not seen:
            return f"; none of the {len(self.endpoints)} endpoints is reachable"
        if len(leaderless) == len(seen):
            return (
                f"; the etcd cluster has lost its quorum: no leader, as "
                f"{', '.join(leaderless)} report ({len(down)} of the {len(self.endpoints)} "
                f"endpoints unreachable: {', '.join(down) or '-'})"
            )
        return ""

    def has_leader(self) -> bool | None:
        """Whether some reachable member reports a leader (None: none reachable)."""
        reachable = False
        for ep in self._order():
            try:
                status = self._post(ep, "maintenance/status", b"{}", min(1.0, self.request_timeout))
            except (OSError, http.client.HTTPException):
                continue
            reachable = True
            if status.get("leader") and not status.get("errors"):
                return True
        return False if reachable else None

    # ------------------------------------------------------------------ watches

    def watch(
        self, key: bytes, range_end: bytes | None, start_revision: int, deadline: float | None
    ) -> Iterator[list[dict]]:
        """Lists of events on [key, range_end) from `start_revision` on, as they come,
        until `deadline` (monotonic; then it returns) or the caller stops iterating. A
        member that goes away is left for the next endpoint, from the revision after the
        last event seen: no event is missed or repeated."""
        request: dict[str, Any] = {"key": b64(key), "start_revision": str(start_revision)}
        if range_end is not None:
            request["range_end"] = b64(range_end)
        next_rev = start_revision
        failures: list[str] = []
        give_up = None if deadline is None else deadline
        while True:
            progressed = False
            for ep in self._order():
                if give_up is not None and time.monotonic() >= give_up:
                    return
                request["start_revision"] = str(next_rev)
                try:
                    for events, rev in self._watch_one(ep, request, deadline):
                        progressed = True
                        if rev is not None:
                            next_rev = max(next_rev, rev + 1)
                        if events:
                            yield events
                    return  # the deadline passed
                except (OSError, http.client.HTTPException, EtcdError) as exc:
                    failures.append(f"{ep}: {exc}")
            if not progressed and (deadline is None or time.monotonic() < deadline):
                # every endpoint failed at once: a pause, then around again, within the
                # deadline (a watch without one raises instead of spinning for ever)
                if deadline is None and len(failures) > 4 * len(self.endpoints):
                    raise EtcdError(f"cannot watch {self.where()}: "
                                    + "; ".join(_last_per_endpoint(failures)))  # fmt: skip
                time.sleep(0.1)

    def _watch_one(
        self, ep: Endpoint, request: dict, deadline: float | None
    ) -> Iterator[tuple[list[dict], int | None]]:
        first = self.request_timeout if deadline is None else deadline - time.monotonic()
        if first <= 0:
            return
        conn = self._connect(ep, min(first, self.connect_timeout))
        try:
            conn.sock.settimeout(min(first, self.request_timeout))
            conn.request("POST", "/v3/watch", json.dumps({"create_request": request}).encode(),
                         self._headers())  # fmt: skip
            resp = conn.getresponse()
            if resp.status != 200:
                raise http.client.HTTPException(f"watch: HTTP {resp.status}")
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return
                # A quiet watch has nothing to say: the socket waits for the deadline
                # (or indefinitely), not for the request timeout.
                conn.sock.settimeout(left)
                try:
                    line = resp.readline(MAX_ANSWER_BYTES)
                except TimeoutError:
                    return
                if not line:
                    raise http.client.HTTPException("the member ended the watch")
                message = json.loads(line)
                error = _error_of(message)
                if error is not None:
                    raise EtcdError(f"watch on {ep}: {error[0]}", error[1])
                result = message.get("result") or {}
                if result.get("canceled"):
                    raise EtcdError(f"watch on {ep} canceled: {result.get('cancel_reason', '')}")
                if result.get("compact_revision") not in (None, "0"):
                    raise EtcdError(f"watch on {ep}: revision {request['start_revision']} "
                                    "was compacted")  # fmt: skip
                events = result.get("events") or []
                rev = max((int(e["kv"]["mod_revision"]) for e in events), default=None)
                if rev is None and "header" in result and not result.get("created"):
                    rev = int(result["header"].get("revision", 0)) or None
                yield events, rev
        finally:
            conn.close()


def _error_of(answer: dict) -> tuple[str, int | None] | None:
    err = answer.get("error")
    if err is None:
        return None
    if isinstance(err, dict):  # a streaming call's error
        return str(err.get("message", err)), err.get("grpc_code")
    code = answer.get("code")
    return str(answer.get("message") or err), int(code) if code is not None else None


def _last_per_endpoint(failures: list[str]) -> list[str]:
    last: dict[str, str] = {}
    for f in failures:
        last[f.split(": ", 1)[0]] = f
    return list(last.values())


__all__ = ["EtcdAuth", "EtcdClient", "EtcdError", "Endpoint", "b64", "parse_endpoints",
           "prefix_end", "unb64"]  # fmt: skip
