"""TLS 1.3 for a job's connections, on request (PYCOLLECTIVE_TLS=1 or `pycollective run
--tls`): every store and transport connection is then encrypted and integrity-checked, and
both ends present a certificate the other verifies (mutual authentication).

Certificates, one of two ways:

* a site's own: PYCOLLECTIVE_TLS_CERT (a PEM certificate, its chain after it),
  PYCOLLECTIVE_TLS_KEY (its private key; may be the same file) and PYCOLLECTIVE_TLS_CA
  (the PEM certificates peers' certificates must chain to);
* none given: a per-job CA whose key is derived from the job's key (every process that
  holds the job's secret derives the same CA, on any host, with nothing to distribute),
  and a certificate of its own per process, signed by it, made in memory. This needs the
  `cryptography` package (`pip install pycollective[tls]`).

Either way the job's secret is still proved inside TLS (the handshake of _auth.py, bound
to the TLS channel), so a certificate alone admits nobody. Host names are not checked:
ranks dial addresses, and who may join is decided by the CA and the secret.
"""

from __future__ import annotations

import datetime
import functools
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

from . import _config, _files
from ._errors import UsageError
from ._keys import JobKey

_CA_LABEL = b"tls-ca-key"


@dataclass(frozen=True)
class TLSConfig:
    """Which certificates a process uses: the site's files, or derived from the job's key."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    @property
    def derived(self) -> bool:
        return self.cert is None

    def describe(self) -> str:
        return "a per-job CA derived from the job's key" if self.derived else f"CA {self.ca}"


def from_env(environ: Mapping[str, str] | None = None) -> TLSConfig | None:
    """The TLS configuration PYCOLLECTIVE_TLS* ask for, or None (plain TCP)."""
    cert = _config.get("PYCOLLECTIVE_TLS_CERT", environ)
    key = _config.get("PYCOLLECTIVE_TLS_KEY", environ)
    ca = _config.get("PYCOLLECTIVE_TLS_CA", environ)
    on = _config.get("PYCOLLECTIVE_TLS", environ) == "1"
    given = [name for name, v in (("CERT", cert), ("KEY", key), ("CA", ca)) if v]
    if not on and not given:
        return None
    if not given:
        return TLSConfig()
    if not (cert and ca):
        raise UsageError(
            "TLS with a site's certificates needs PYCOLLECTIVE_TLS_CERT and PYCOLLECTIVE_TLS_CA "
            "(and PYCOLLECTIVE_TLS_KEY unless the key is in the certificate's file); got only "
            + ", ".join(f"PYCOLLECTIVE_TLS_{n}" for n in given)
        )
    for what, path in (("PYCOLLECTIVE_TLS_CERT", cert), ("PYCOLLECTIVE_TLS_CA", ca)):
        if not os.path.isfile(path):
            raise UsageError(f"{what}={path}: no such file")
    if key:
        # a private key readable by others is refused (a link the user named is followed)
        _files.read_private(os.path.realpath(key), 1 << 20)
    return TLSConfig(cert, key, ca)
    return TLSConfig()


def context(config: TLSConfig, job: JobKey, server: bool) -> ssl.SSLContext:
    """An SSLContext for one side: TLS 1.3 only, the peer's certificate required."""
    return _context(config, job.secret if config.derived else b"", server)


@functools.lru_cache(maxsize=8)
def _context(config: TLSConfig, secret: bytes, server: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    if server:
        ctx.num_tickets = 0  # no session resumption: nothing arrives after the handshake
    try:
        if config.derived:
            ca_pem, chain_pem = _derived_credentials(secret)
            ctx.load_verify_locations(cadata=ca_pem.decode("ascii"))
            _load_chain(ctx, chain_pem)
        else:
            assert config.cert is not None and config.ca is not None  # noqa: S101
            ctx.load_verify_locations(cafile=config.ca)
            ctx.load_cert_chain(config.cert, config.key)
    except (ssl.SSLError, OSError) as exc:
        raise UsageError(f"cannot set up TLS with {config.describe()}: {exc}") from None
    return ctx


def _load_chain(ctx: ssl.SSLContext, pem: bytes) -> None:
    """load_cert_chain reads files only: the PEM goes through a private file that lives
    for the call."""
    folder = tempfile.mkdtemp(prefix="pycollective-tls-")  # 0700
    path = os.path.join(folder, "chain.pem")
    try:
        _files.write_private(path, pem)
        ctx.load_cert_chain(path)
    finally:
        try:
            os.unlink(path)
        finally:
            os.rmdir(folder)


def _derived_credentials(secret: bytes) -> tuple[bytes, bytes]:
    """(the job CA's certificate, this process's key and certificate), as PEM. The CA's key
    comes from the job's key, so every process derives the same CA; the CA certificate
    itself may differ in its signature and dates from process to process, which does not
    matter: a chain is checked against the CA's name and key."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        raise UsageError(
            "PYCOLLECTIVE_TLS=1 without certificates needs the cryptography package to make "
            "the job's own (pip install 'pycollective[tls]'), or give a site's own with "
            "PYCOLLECTIVE_TLS_CERT, PYCOLLECTIVE_TLS_KEY and PYCOLLECTIVE_TLS_CA"
        ) from None
    job = JobKey(secret, "")
    curve = ec.SECP256R1()
    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
    scalar = int.from_bytes(job.derive(_CA_LABEL), "big") % (order - 1) + 1
    ca_key = ec.derive_private_key(scalar, curve)
    ca_name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"pycollective job {job.fingerprint}")]
    )
    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - day)
        .not_valid_after(now + 3650 * day)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    mine = ec.generate_private_key(curve)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pycollective rank")]))
        .issuer_name(ca_name)
        .public_key(mine.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - day)
        .not_valid_after(now + 365 * day)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = mine.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ca_cert.public_bytes(pem), key_pem + cert.public_bytes(pem)


__all__ = ["TLSConfig", "context", "from_env"]
