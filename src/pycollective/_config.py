"""Every PYCOLLECTIVE_* environment variable, declared once: name, type, default, what it
accepts and what it means. Modules read them through `get(name)`, which parses and checks
the value (a bad one raises UsageError naming the variable and what it accepts);
init_process_group checks them all at once (`check_environment`) and warns, once, about
PYCOLLECTIVE_* names it does not know, with the closest known one. docs/configuration.md is
generated from this table (`markdown()`; a test keeps it current).

A leaf: it imports nothing of the package but the errors, so every layer can read it.
"""

from __future__ import annotations

import datetime
import difflib
import math
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ._errors import UsageError

PREFIX = "PYCOLLECTIVE_"
DEFAULT_TIMEOUT = 300.0  # seconds; torch's 30 minutes is too long to wait on a hang
TIMEOUT_HINT = "after {seconds:g} s; set timeout= or PYCOLLECTIVE_TIMEOUT to change it"
# The collectives PYCOLLECTIVE_<COLLECTIVE>_ALGORITHM exists for.
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "gather",
    "scatter",
    "all_to_all",
    "barrier",
)

# ---------------------------------------------------------------------- value types


@dataclass(frozen=True)
class Kind:
    """How a value is parsed: `parse(text)` returns it or raises ValueError; `accepts` says
    in words what is accepted (for the error and the documentation)."""

    parse: Callable[[str], Any]
    accepts: str


def _number(
    cast: Callable[[str], Any], low: float | None, what: str, strict_low: bool = False
) -> Kind:
    def parse(text: str) -> Any:
        value = cast(text.strip())
        # NaN fails no comparison, so it must be refused by name (and inf with it: no
        # setting means "forever"; a deadline of NaN or inf would be a hang)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(text)
        if low is not None and (value < low or (strict_low and value == low)):
            raise ValueError(text)
        return value

    return Kind(parse, what)


def _choice(*names: str, aliases: Mapping[str, str] | None = None) -> Kind:
    table = {n.lower(): n for n in names} | dict(aliases or {})

    def parse(text: str) -> str:
        key = text.strip().lower()
        if key not in table:
            raise ValueError(text)
        return table[key]

    return Kind(parse, " | ".join(names))


def _text(what: str) -> Kind:
    def parse(text: str) -> str:
        if not text.strip():
            raise ValueError(text)
        return text.strip()

    return Kind(parse, what)


def _cost(text: str) -> tuple[float, ...]:
    values = tuple(float(x) for x in text.split(","))
    if len(values) not in (3, 4, 7) or not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(text)
    return values


SECONDS = _number(float, 0.0, "a finite number of seconds > 0", strict_low=True)
COUNT = _number(int, 0, "a whole number >= 0")
POSITIVE = _number(int, 1, "a whole number >= 1")
BYTES = _number(int, 1, "a number of bytes >= 1")
MICROSECONDS = _number(float, 0.0, "a finite number of microseconds >= 0")
SWITCH = _choice(
    "1", "0", aliases={"on": "1", "yes": "1", "true": "1", "off": "0", "no": "0", "false": "0"}
)
AUTO_SWITCH = _choice(
    "auto",
    "1",
    "0",
    aliases={"on": "1", "yes": "1", "true": "1", "off": "0", "no": "0", "false": "0"},
)
TRANSPORTS = _choice("auto", "tcp", "shm")
SERIALIZERS = _choice("auto", "pickle", "safe")
CALIBRATE = _choice(
    "1",
    "0",
    "missing",
    aliases={
        "on": "1",
        "yes": "1",
        "true": "1",
        "always": "1",
        "off": "0",
        "no": "0",
        "false": "0",
    },
)
COST = Kind(
    _cost,
    "alpha,beta,gamma[,overhead[,msg_cpu,byte_cpu,call_cpu]] (seconds, seconds per byte; "
    "finite, >= 0)",
)


def _bounds(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    lo, hi = int(low), int(high)
    if not 1 <= lo <= hi:
        raise ValueError(text)
    return lo, hi


BOUNDS = Kind(_bounds, "MIN:MAX, whole numbers with 1 <= MIN <= MAX")
ROLES = _choice("worker", "server")
DEBUG_LEVELS = _choice("INFO", "DETAIL", "OFF")
PATH = _text("a path")
NAME = _text("a non-empty string")
ALGORITHM = _text("auto or an algorithm name of that collective (pycollective.algorithms)")


# ---------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Var:
    name: str
    kind: Kind
    default: Any
    meaning: str
    who: str = "user"  # "user"; "launcher" (set by pycollective run for its ranks); "tests"


def _vars() -> tuple[Var, ...]:
    user = [
        Var(
            "PYCOLLECTIVE_TIMEOUT",
            SECONDS,
            DEFAULT_TIMEOUT,
            "Per-collective timeout when init_process_group/new_group get no timeout=.",
        ),
        Var(
            "PYCOLLECTIVE_TRANSPORT",
            TRANSPORTS,
            "auto",
            "auto: shared memory for groups on one host, TCP otherwise; tcp: never shared "
            "memory; shm: require it (a group that cannot use it raises).",
        ),
        Var(
            "PYCOLLECTIVE_SECRET",
            NAME,
            None,
            "The job's key that every connection proves (surrounding whitespace ignored; "
            "pycollective run makes one per single-host job). Default: the per-user key "
            "file, $XDG_CONFIG_HOME/pycollective/secret (docs/security.md).",
        ),
        Var(
            "PYCOLLECTIVE_SECRET_FILE",
            PATH,
            None,
            "A file holding the job's key instead (this user's, mode 0600, as ssh demands).",
        ),
        Var(
            "PYCOLLECTIVE_INSECURE",
            SWITCH,
            "0",
            "1: authenticate nobody (an empty key; anyone who reaches a port may join) and "
            "refuse pickles from peers. For debugging only; warned about on every rank.",
        ),
        Var(
            "PYCOLLECTIVE_TLS",
            SWITCH,
            "0",
            "1: every store and transport connection runs TLS 1.3 with mutual certificates "
            "(a per-job CA derived from the job's key unless PYCOLLECTIVE_TLS_CERT is given).",
        ),
        Var(
            "PYCOLLECTIVE_TLS_CERT",
            PATH,
            None,
            "A site's PEM certificate (and chain) for TLS; turns TLS on.",
        ),
        Var(
            "PYCOLLECTIVE_TLS_KEY",
            PATH,
            None,
            "The private key of PYCOLLECTIVE_TLS_CERT (mode 0600), unless in the same file.",
        ),
        Var(
            "PYCOLLECTIVE_TLS_CA",
            PATH,
            None,
            "PEM certificates that peers' TLS certificates must chain to.",
        ),
        Var(
            "PYCOLLECTIVE_BIND_ADDRESSES",
            SWITCH,
            "1",
            "0: handshakes accepted here do not name the connection's addresses, for NAT or "
            "a proxy between ranks (a relay is then not told from a translation: use TLS).",
        ),
        Var(
            "PYCOLLECTIVE_MAX_EARLY_BYTES",
            BYTES,
            2 << 30,
            "Bytes a rank keeps of messages that came before their receive was posted; a "
            "peer sending more loses its connection with an error naming this variable.",
        ),
        Var(
            "PYCOLLECTIVE_MAX_OBJECT_BYTES",
            BYTES,
            4 << 30,
            "Largest serialized object an object collective or elastic state transfer "
            "accepts from a peer.",
        ),
        Var(
            "PYCOLLECTIVE_STORE_MAX_BYTES",
            BYTES,
            1 << 30,
            "Bytes of keys and values a TCP store server holds at most (a set beyond it "
            "fails with StoreError).",
        ),
        Var(
            "PYCOLLECTIVE_STORE",
            NAME,
            None,
            "The rendezvous store when init_method names none: etcd://HOST:PORT[,HOST:PORT"
            "...]/JOB (an etcd cluster, endpoints tried in turn; etcds:// for TLS). "
            "pycollective run --rdzv-backend etcd sets it.",
        ),
        Var(
            "PYCOLLECTIVE_ETCD_CACERT",
            PATH,
            None,
            "The CA that signed the etcd members' certificates (https endpoints).",
        ),
        Var(
            "PYCOLLECTIVE_ETCD_CERT",
            PATH,
            None,
            "A client certificate for etcd (--client-cert-auth), with PYCOLLECTIVE_ETCD_KEY.",
        ),
        Var("PYCOLLECTIVE_ETCD_KEY", PATH, None, "The key of PYCOLLECTIVE_ETCD_CERT."),
        Var(
            "PYCOLLECTIVE_ETCD_USER",
            NAME,
            None,
            "The etcd user to authenticate as (etcd's own auth), with "
            "PYCOLLECTIVE_ETCD_PASSWORD_FILE.",
        ),
        Var(
            "PYCOLLECTIVE_ETCD_PASSWORD_FILE",
            PATH,
            None,
            "A file holding the password of PYCOLLECTIVE_ETCD_USER.",
        ),
        Var(
            "PYCOLLECTIVE_SOCKET_IFNAME",
            NAME,
            None,
            "The network interface whose address a rank advertises (multi-host jobs).",
        ),
        Var(
            "PYCOLLECTIVE_HOST_ID",
            NAME,
            None,
            "Replaces this host's identity (which ranks may share memory), e.g. to simulate "
            "several hosts on one machine.",
        ),
        Var(
            "PYCOLLECTIVE_CORES",
            POSITIVE,
            None,
            "The cores this job's ranks share on a host (default: the affinity, or the "
            "host's cores for a rank pinned to one).",
        ),
        Var(
            "PYCOLLECTIVE_TIMELINE",
            PATH,
            None,
            "Record every call in a Chrome trace: one file per rank (trace.rank0.json ...), "
            "merged by pycollective run.",
        ),
        Var("PYCOLLECTIVE_TIMELINE_LIMIT", COUNT, 1_000_000, "Timeline events kept per process."),
        Var(
            "PYCOLLECTIVE_FLIGHT_RECORDER",
            COUNT,
            256,
            "Operations the flight recorder keeps per process (0 turns it off).",
        ),
        Var(
            "PYCOLLECTIVE_FLIGHT_DIR",
            PATH,
            None,
            "Where flight-recorder dumps go (default: $TMPDIR/pycollective-flight-<uid>; "
            "pycollective run makes one per job).",
        ),
        Var(
            "PYCOLLECTIVE_CALIBRATE",
            CALIBRATE,
            "0",
            "1: measure the cost parameters at init_process_group; missing: only while "
            "this host's cache has none (rank 0's setting decides).",
        ),
        Var(
            "PYCOLLECTIVE_COST_CACHE",
            PATH,
            None,
            "Directory of the calibration cache (default $XDG_CACHE_HOME/pycollective), or off.",
        ),
        Var(
            "PYCOLLECTIVE_COST_TCP",
            COST,
            None,
            "The TCP cost parameters auto prices with, instead of the cache or defaults.",
        ),
        Var(
            "PYCOLLECTIVE_OBJECT_SERIALIZER",
            SERIALIZERS,
            "auto",
            "auto: object collectives pickle, as torch's (only with authenticated peers), "
            "the library's own transfers (elastic state, parameter-server set-up) never do; "
            "pickle: both may; safe: nothing is pickled and pickled payloads are refused.",
        ),
        Var(
            "PYCOLLECTIVE_SHM_SLOT_BYTES",
            BYTES,
            None,
            "Bytes per rank and buffer of a shared-memory arena (rounded to 4 KiB; default "
            "1 MiB, 4 MiB with more ranks than cores).",
        ),
        Var(
            "PYCOLLECTIVE_SHM_CHUNK_BYTES",
            BYTES,
            None,
            "Largest chunk of a pipelined arena reduction, as group rank 0 reads it (default "
            "256 KiB when rank 0 runs the compiled arena, 1 MiB when the Python one; the "
            "slot size bounds it too).",
        ),
        Var(
            "PYCOLLECTIVE_SHM_SINGLE_COPY",
            SWITCH,
            "1",
            "1: compiled arena calls on ordinary buffers read or write the peers' buffers "
            "directly (process_vm_readv/writev, where the system lets every rank reach every "
            "other: checked at set-up), with no copy through the arena: all_gather and "
            "reduce_scatter above 256 KiB, broadcast from 256 KiB to 16 MiB, all_reduce above "
            "4 MiB; 0: always through the arena.",
        ),
        Var(
            "PYCOLLECTIVE_SHM_NT_BYTES",
            BYTES,
            None,
            "Compiled arena calls at least this large copy results into the caller's "
            "buffer with non-temporal stores (default: the size of the L3 cache, 32 MiB "
            "when unknown).",
        ),
        Var(
            "PYCOLLECTIVE_SHM_SPIN_US",
            MICROSECONDS,
            None,
            "How long an arena wait polls with sched_yield before sleeping (default 1000 us, "
            "300 us with more ranks than cores).",
        ),
        Var(
            "PYCOLLECTIVE_TCP_NATIVE",
            SWITCH,
            "0",
            "1: a TCP reduction's payload is read and combined into the destination by the "
            "compiled core as it arrives (GIL released, a cache-sized piece at a time); 0 "
            "(the default: it measured no faster, docs/tcp.md): in Python, through a 1 MiB "
            "window and numpy (the reference). TLS connections and a missing or disabled "
            "extension (PYCOLLECTIVE_NATIVE=0) always use Python.",
        ),
        Var(
            "PYCOLLECTIVE_TCP_RECV_HELPER",
            AUTO_SWITCH,
            "auto",
            "Whether a TCP exchange's large payloads (4 MiB and up) are read by a second "
            "thread while the first reduces: auto (the default) while the machine has more "
            "than twice as many runnable tasks as CPUs besides the rank's own running "
            "threads (/proc/loadavg; a rank short of a core then gets it back sooner: 64 MiB "
            "1.1-1.4x faster beside stress-ng), 1 always, 0 never (where ranks have their "
            "cores the hand-offs cost more than they win).",
        ),
        Var(
            "PYCOLLECTIVE_LOAD_AWARE",
            SWITCH,
            "1",
            "1: while the machine has more runnable tasks than CPUs (/proc/loadavg, read at "
            "most every 5 ms), the shared-memory arena's waits spin and yield briefly and "
            "sleep soon, as with more ranks than cores, so that a peer short of a core gets "
            "one, and a TCP exchange's polling budget may fall to 0 (on a quiet machine it "
            "stays at 50 us at least); 0: they never look at the machine's load.",
        ),
        Var(
            "PYCOLLECTIVE_SHM_FUTEX",
            SWITCH,
            "1",
            "0: arena waits sleep in short naps instead of on a futex.",
        ),
        Var(
            "PYCOLLECTIVE_DEBUG",
            DEBUG_LEVELS,
            None,
            "INFO: log the job's few facts once each (the rendezvous: who found whom, "
            "where, how long); DETAIL: also the algorithm each distinct call runs and every "
            "call (NCCL_DEBUG's habit; see pycollective/_log.py).",
        ),
        Var(
            "PYCOLLECTIVE_NATIVE",
            SWITCH,
            "1",
            "0: the shared-memory arena and TCP reductions run in Python (the reference) "
            "instead of the compiled pycollective._native; at build time (pip install, "
            "setup.py), the extension is not built.",
        ),
        Var(
            "PYCOLLECTIVE_NUM_SERVERS",
            COUNT,
            None,
            "Parameter servers among the ranks (pycollective.ps; pycollective run --servers "
            "sets it).",
        ),
    ]
    algos = [
        Var(
            f"PYCOLLECTIVE_{c.upper()}_ALGORITHM",
            ALGORITHM,
            "auto",
            f"The algorithm {c} runs when the call gives no algorithm=.",
        )
        for c in COLLECTIVES
    ]
    launcher = [
        Var(
            "PYCOLLECTIVE_STORE_HOSTED",
            SWITCH,
            None,
            "1: the launcher hosts the rendezvous store at MASTER_ADDR:MASTER_PORT.",
            "launcher",
        ),
        Var("PYCOLLECTIVE_NNODES", POSITIVE, None, "Nodes of the job.", "launcher"),
        Var(
            "PYCOLLECTIVE_JOB_ID",
            NAME,
            None,
            "Tells this job's flight dumps and timeline files from another's.",
            "launcher",
        ),
        Var(
            "PYCOLLECTIVE_ROLE",
            ROLES,
            None,
            "This rank's role in a parameter-server job.",
            "launcher",
        ),
        Var(
            "PYCOLLECTIVE_RESTART_COUNT",
            COUNT,
            None,
            "Which attempt of the job this is (pycollective run --max-restarts; torchrun's "
            "TORCHELASTIC_RESTART_COUNT too).",
            "launcher",
        ),
        Var(
            "PYCOLLECTIVE_ELASTIC",
            BOUNDS,
            None,
            "The elastic bounds of the job (pycollective run --elastic MIN:MAX).",
            "launcher",
        ),
    ]
    tests = [
        Var(
            "PYCOLLECTIVE_FUZZ_SECONDS",
            SECONDS,
            None,
            "Seconds each fuzz target of fuzz/ runs in the test suite (default 1).",
            "tests",
        ),
        Var(
            "PYCOLLECTIVE_FUZZ_NATIVE",
            PATH,
            None,
            "An instrumented build of pycollective._native the fuzz targets load "
            "(python -m fuzz.native; make fuzz).",
            "tests",
        ),
        Var(
            "PYCOLLECTIVE_FUZZ_REPORT",
            PATH,
            None,
            "Where the store attacks beside a live job report (make faults).",
            "tests",
        ),
        Var("PYCOLLECTIVE_TEST_JOB", NAME, None, "Tags the test suite's jobs.", "tests"),
        Var(
            "PYCOLLECTIVE_ATTACK_FLOOD",
            POSITIVE,
            None,
            "Half-open connections the attack tests' floods hold (tests/security; make faults).",
            "tests",
        ),
    ]
    return tuple(user + algos + launcher + tests)


VARS: dict[str, Var] = {v.name: v for v in _vars()}


# ---------------------------------------------------------------------- reading


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of a declared variable (its default when unset or empty), parsed and
    checked: a bad value raises UsageError naming the variable and what it accepts."""
    var = VARS[name]  # KeyError: a variable nobody declared (a bug, not a user error)
    text = (os.environ if environ is None else environ).get(name)
    if text is None or not text.strip():
        return var.default
    try:
        return var.kind.parse(text)
    except (ValueError, TypeError):
        raise UsageError(
            f"{name}={text!r} is not valid: it takes {var.kind.accepts}"
            + (f" (default {var.default!r})" if var.default is not None else "")
        ) from None


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    text = (os.environ if environ is None else environ).get(name)
    return text is not None and bool(text.strip())


def algorithm_choice(collective: str, algorithm: str | None) -> str:
    """The algorithm a call asked for: its `algorithm=`, else PYCOLLECTIVE_<C>_ALGORITHM,
    else "auto"."""
    if algorithm:
        return algorithm
    name = f"PYCOLLECTIVE_{collective.upper()}_ALGORITHM"
    return get(name) if name in VARS else "auto"


def timeout_hint(seconds: float) -> str:
    """What a timeout message says about how long it waited and how to change it."""
    return TIMEOUT_HINT.format(seconds=seconds)


def with_timeout_hint(exc: BaseException, seconds: float) -> None:
    """Append timeout_hint to an exception's message, once."""
    hint = timeout_hint(seconds)
    if hint not in str(exc):
        exc.args = (f"{exc} ({hint})",)


def timeout_seconds(timeout: Any) -> float:
    """A timeout given as seconds or a timedelta, or PYCOLLECTIVE_TIMEOUT's, or 300 s."""
    if timeout is None:
        return float(get("PYCOLLECTIVE_TIMEOUT"))
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if (
        not isinstance(timeout, (int, float))
        or isinstance(timeout, bool)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise UsageError(
            f"timeout must be a positive number of seconds (finite) or a timedelta, got {timeout!r}"
        )
    return float(timeout)


def check_environment(
    environ: Mapping[str, str] | None = None,
    algorithms: Mapping[str, Iterable[str]] | None = None,
) -> None:
    """Check every declared variable that is set (the first bad one raises UsageError),
    algorithm names against `algorithms` (collective -> names it accepts, "auto"
    included), and warn once about unknown PYCOLLECTIVE_* names."""
    env = os.environ if environ is None else environ
    for name in VARS:
        value = get(name, env)
        if algorithms is not None and name.endswith("_ALGORITHM") and is_set(name, env):
            collective = name[len(PREFIX) : -len("_ALGORITHM")].lower()
            allowed = list(algorithms.get(collective, ()))
            if allowed and value not in allowed:
                raise UsageError(
                    f"{name}={value!r} is not an algorithm of {collective}: it takes one of "
                    f"{allowed}"
                )
    for name in env:
        if name.startswith(PREFIX) and name not in VARS and first_time(f"unknown:{name}"):
            close = difflib.get_close_matches(name, VARS, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            warnings.warn(
                f"{name} is not a pycollective setting and is ignored{hint} "
                "(the settings: docs/configuration.md)",
                stacklevel=3,
            )


# ---------------------------------------------------------------------- one-time notes

# Keys of the one-time warnings this process has given (a documented registry).
_SAID: set[str] = set()
_SAID_LOCK = threading.Lock()


def first_time(key: str) -> bool:
    """True the first time it is asked about `key` in this process (warn-once helper)."""
    with _SAID_LOCK:
        if key in _SAID:
            return False
        _SAID.add(key)
        return True


# ---------------------------------------------------------------------- documentation


def markdown() -> str:
    """docs/configuration.md, generated from the table."""
    out = [
        "# Configuration",
        "",
        "Every `PYCOLLECTIVE_*` environment variable pycollective reads. They are checked",
        "when the process group starts: a bad value raises `UsageError` naming the variable",
        "and what it accepts, and an unknown `PYCOLLECTIVE_*` name is warned about once,",
        "with the closest known one.",
        "",
        "Generated from the table in `src/pycollective/_config.py`; a test checks that this",
        "page is current. To regenerate it:",
        "",
        "    python -c 'from pycollective import _config; print(_config.markdown(), end=\"\")' \\",
        "        > docs/configuration.md",
    ]
    titles = {
        "user": "Settings",
        "launcher": "Set by `pycollective run` for its ranks",
        "tests": "Read by the test suite and tools only",
    }
    for who, title in titles.items():
        out += [
            "",
            f"## {title}",
            "",
            "| variable | accepts | default | meaning |",
            "|---|---|---|---|",
        ]
        for v in VARS.values():
            if v.who != who:
                continue
            default = "" if v.default is None else f"`{v.default}`"
            accepts = v.kind.accepts.replace("|", "\\|")
            out.append(f"| `{v.name}` | {accepts} | {default} | {v.meaning} |")
    return "\n".join(out) + "\n"
