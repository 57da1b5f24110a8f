"""The job's key: what every connection of a job proves it holds (the handshake, _auth.py).

Where it comes from (the first that is set wins; the launcher and every rank read it with
the same function, so they agree):

    PYCOLLECTIVE_SECRET        its value, without surrounding whitespace
    PYCOLLECTIVE_SECRET_FILE   the file's contents, stripped; the file must be this user's
                               and private (0600), as ssh judges a key file
    PYCOLLECTIVE_INSECURE=1    no key at all: anyone who reaches a port may join and nothing
                               a peer sends is unpickled (loud; for debugging only)
    the per-user key file      $XDG_CONFIG_HOME/pycollective/secret (~/.config/... by
                               default), made 0600 with 32 random bytes on first use, as an
                               SSH or MUNGE key: every job of this user agrees with no step,
                               on one host and on hosts that share the home directory

A job never runs on a key anyone can compute: an empty key exists only with the opt-out.
Ranks whose keys differ find out in the handshake, which names both keys' fingerprints and
what to set (`JobKey.hint`).

A leaf: imports nothing of the package but other leaves.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from . import _config, _files
from ._errors import UsageError

log = logging.getLogger("pycollective.auth")

KEY_FILE_NAME = "secret"
MAX_SECRET_FILE_BYTES = 64 * 1024
WEAK_SECRET_CHARS = 16  # shorter secrets can be guessed offline from a handshake


@dataclass(frozen=True)
class JobKey:
    """The job's secret and where it came from (for messages, never the secret itself)."""

    secret: bytes
    source: str
    insecure: bool = False

    @property
    def fingerprint(self) -> str:
        """Which key this is, not the key: 16 hex digits, shown when keys differ."""
        if self.insecure:
            return "none (PYCOLLECTIVE_INSECURE=1)"
        return self.derive(b"fingerprint")[:8].hex()

    def derive(self, label: bytes) -> bytes:
        """A 32-byte key for one use (`label`), so no two uses share the secret itself."""
        return hmac.new(self.secret, b"pycollective/v2/" + label, hashlib.sha256).digest()

    def hint(self) -> str:
        """What to do when another process's key differs from this one."""
        return (
            f"this process's key (fingerprint {self.fingerprint}) comes from {self.source}; "
            "every rank of a job needs the same key: set PYCOLLECTIVE_SECRET (or "
            "PYCOLLECTIVE_SECRET_FILE) to the same value on every host, or share the home "
            "directory that holds the per-user key file"
        )

    def __repr__(self) -> str:  # never print the secret
        return f"JobKey(fingerprint={self.fingerprint!r}, source={self.source!r})"


def key_file_path(environ: Mapping[str, str] | None = None) -> str:
    """Where this user's key file lives: $XDG_CONFIG_HOME/pycollective/secret, else
    ~/.config/pycollective/secret (the XDG base directory rules)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME", "").strip()
    if not base or not os.path.isabs(base):
        home = env.get("HOME", "").strip() or os.path.expanduser("~")
        base = os.path.join(home, ".config")
    return os.path.join(base, "pycollective", KEY_FILE_NAME)


def job_key(environ: Mapping[str, str] | None = None, *, create: bool = True) -> JobKey:
    """The job's key, from the environment or the per-user key file (made when missing and
    `create`). Raises UsageError when a secret file is not private."""
    value = _config.get("PYCOLLECTIVE_SECRET", environ)
    if value:
        if len(value) < WEAK_SECRET_CHARS and _config.first_time("weak-secret"):
            warnings.warn(
                f"PYCOLLECTIVE_SECRET has {len(value)} characters: a short secret can be "
                "guessed offline from one handshake; use at least "
                f"{WEAK_SECRET_CHARS} random ones (e.g. `openssl rand -hex 32`)",
                stacklevel=2,
            )
        return JobKey(value.encode("utf-8"), "PYCOLLECTIVE_SECRET")
    path = _config.get("PYCOLLECTIVE_SECRET_FILE", environ)
    if path:
        # A path the user named may be a link (a Kubernetes secret mount is one); the file
        # it leads to must be theirs and private all the same.
        real = os.path.realpath(path)
        return JobKey(_read_secret_file(real), f"PYCOLLECTIVE_SECRET_FILE ({path})")
    if _config.get("PYCOLLECTIVE_INSECURE", environ) == "1":
        warn_insecure()
        return JobKey(b"", "PYCOLLECTIVE_INSECURE=1", insecure=True)
    return user_key(environ, create=create)


def user_key(environ: Mapping[str, str] | None = None, *, create: bool = True) -> JobKey:
    """This user's key file, made on first use (atomically: of several processes starting
    at once, one writes it and every one reads the same key)."""
    path = key_file_path(environ)
    if create and not os.path.exists(path):
        folder = os.path.dirname(path)
        try:
            _files.private_dir(folder)  # 0700, made with its parents when missing
            if _files.create_private(path, secrets.token_hex(32).encode() + b"\n"):
                log.info("made this user's pycollective key file %s (0600)", path)
        except OSError as exc:
            raise UsageError(
                f"cannot make the per-user key file {path}: {exc}. Set PYCOLLECTIVE_SECRET "
                "(the same on every rank) or PYCOLLECTIVE_SECRET_FILE instead"
            ) from None
    secret = _read_secret_file(path)
    return JobKey(secret, f"the per-user key file {path}")


def _read_secret_file(path: str) -> bytes:
    try:
        secret = _files.read_private(path, MAX_SECRET_FILE_BYTES).strip()
    except OSError as exc:
        raise UsageError(f"cannot use the key file: {exc}") from None
    if not secret:
        raise UsageError(f"the key file {path} is empty; put a long random secret in it")
    return secret


def as_key(
    secret: bytes | str | JobKey | None,
    what: str = "the secret given",
    environ: Mapping[str, str] | None = None,
) -> JobKey:
    """A key from what a caller passed: None is the job's key (job_key(environ)); bytes and
    str are taken as they are; an empty one only with PYCOLLECTIVE_INSECURE=1."""
    if secret is None:
        return job_key(environ)
    if isinstance(secret, JobKey):
        return secret
    raw = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if raw:
        return JobKey(raw, what)
    if _config.get("PYCOLLECTIVE_INSECURE", environ) == "1":
        warn_insecure()
        return JobKey(b"", "PYCOLLECTIVE_INSECURE=1", insecure=True)
    raise UsageError(
        f"{what} is empty: an empty key authenticates nobody. Pass the job's secret, or None "
        "for the job's key (PYCOLLECTIVE_SECRET, PYCOLLECTIVE_SECRET_FILE or the per-user key "
        "file); PYCOLLECTIVE_INSECURE=1 allows an empty one, for debugging only"
    )


def warn_insecure() -> None:
    """The loud part of the opt-out: once per process, as a warning and in the log."""
    if _config.first_time("insecure"):
        text = (
            "PYCOLLECTIVE_INSECURE=1: this job authenticates nobody. Anyone who reaches its "
            "ports can join it, read and change its store and data; object collectives refuse "
            "pickles. Unset it to use the job's key."
        )
        log.warning(text)
        warnings.warn(text, stacklevel=3)


def secret_from_env() -> bytes:
    """The job's secret as bytes (job_key().secret), for callers that need only the bytes."""
    return job_key().secret


__all__ = ["JobKey", "as_key", "job_key", "key_file_path", "secret_from_env", "user_key"]
