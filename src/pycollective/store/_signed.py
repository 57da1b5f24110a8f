"""Values that cannot be forged without the job's secret, for stores the job does not
authenticate (etcd: anyone who reaches an etcd without auth of its own can write keys).

    envelope = MAGIC(4) nonce(8) tag(32) value
    tag      = HMAC-SHA256(K, DOMAIN | lease:u64 | nonce | len(key):u32 | key | value)
    K        = the job's key derived for this use (JobKey.derive(b"etcd store values"))

The tag covers the key's name (a value cannot be moved to another key), the etcd lease the
value is attached to (so a value of an earlier incarnation of the job, whose lease has
expired, cannot be put back: etcd refuses a put on a lease that no longer exists, and a
put on the current lease fails the tag) and the nonce (which tells a writer whether an
answer it lost was its own write). What it cannot stop: the deletion of keys, or the
replay of an earlier value of the same key in the same incarnation by someone who can
write to etcd; only etcd's own authentication and TLS keep those out (docs/elastic.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from .._errors import StoreError
from .._keys import JobKey

MAGIC = b"pcs1"
NONCE_BYTES = 8
TAG_BYTES = 32
HEADER_BYTES = len(MAGIC) + NONCE_BYTES + TAG_BYTES
_DOMAIN = b"pycollective-etcd-value\0"
_LEASE = struct.Struct("!Q")
_LEN = struct.Struct("!I")


class ForgedValue(StoreError):
    """A value that does not carry a valid tag under the job's secret."""


def derive_key(key: JobKey) -> bytes:
    """The signing key: the job's key derived for this use alone (the handshake's and the
    object seals' are other derivations of it)."""
    return key.derive(b"etcd store values")


def _tag(key: bytes, name: bytes, value: bytes, lease: int, nonce: bytes) -> bytes:
    mac = hmac.new(key, _DOMAIN, hashlib.sha256)
    mac.update(_LEASE.pack(lease & 0xFFFFFFFFFFFFFFFF))
    mac.update(nonce)
    mac.update(_LEN.pack(len(name)))
    mac.update(name)
    mac.update(value)
    return mac.digest()


def seal(key: bytes, name: bytes, value: bytes, lease: int, nonce: bytes | None = None) -> bytes:
    """The envelope of `value` stored under `name` on `lease` (0: none)."""
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    return MAGIC + nonce + _tag(key, name, value, lease, nonce) + value


def open_sealed(key: bytes, name: bytes, envelope: bytes, lease: int, shown: str) -> bytes:
    """The value inside `envelope`; ForgedValue naming `shown` (the key as the caller
    knows it) if it is unsigned, damaged, moved from another key or lease, or forged."""
    if len(envelope) < HEADER_BYTES or not envelope.startswith(MAGIC):
        raise ForgedValue(
            f"the value of store key {shown!r} is not signed with the job's secret (written "
            "by something other than this job's ranks, or by a job with another secret)"
        )
    nonce = envelope[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
    tag = envelope[len(MAGIC) + NONCE_BYTES : HEADER_BYTES]
    value = envelope[HEADER_BYTES:]
    if not hmac.compare_digest(tag, _tag(key, name, value, lease, nonce)):
        raise ForgedValue(
            f"the value of store key {shown!r} fails its signature check (forged, copied from "
            "another key or an earlier run, or written by a job with another secret)"
        )
    return value


def nonce_of(envelope: bytes) -> bytes:
    return envelope[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
