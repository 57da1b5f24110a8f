"""TLS 1.3 on request (PYCOLLECTIVE_TLS=1, `pycollective run --tls`): real jobs over TLS
connections with the job's derived CA or a site's own certificates, a certificate of
another CA refused, and the collective battery over TLS TCP (large messages included:
many records, a send the socket has no room for).

Finding 3 of the security review: traffic was plaintext and unauthenticated after the
handshake.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys

import pytest
from tests._launch import REPO, run_ranks

pytest.importorskip("cryptography")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

pytestmark = pytest.mark.timeout(180)
WORKER = REPO / "tests" / "security" / "_attack_worker.py"
BATTERY = REPO / "tests" / "api" / "battery.py"


def _site_ca(folder, name: str) -> tuple[str, str, str]:
    """A site's CA and a certificate it signed: (cert, key, ca) paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - day)
        .not_valid_after(now + day)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node")]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(2)
        .not_valid_before(now - day)
        .not_valid_after(now + day)
        .sign(key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = [os.path.join(folder, f"{name}-{n}.pem") for n in ("cert", "key", "ca")]
    blobs = [
        leaf.public_bytes(pem),
        leaf_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        ca.public_bytes(pem),
    ]
    for path, blob in zip(paths, blobs, strict=True):
        with open(path, "wb") as f:
            f.write(blob)
        os.chmod(path, 0o600)
    return paths[0], paths[1], paths[2]


def _ok(results) -> None:
    for r in results:
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout.strip().splitlines()[-1])["ok"], r.stdout


def test_a_job_over_tls_with_the_derived_ca() -> None:
    env = {"PYCOLLECTIVE_TLS": "1", "PYCOLLECTIVE_TRANSPORT": "tcp", "PYCOLLECTIVE_DEBUG": "INFO"}
    results = run_ranks(WORKER, 3, ("allreduce",), env=env, timeout=150)
    _ok(results)
    assert "TLS 1.3" in results[0].stderr


def test_the_battery_over_tls_tcp() -> None:
    env = {"PYCOLLECTIVE_TLS": "1", "PYCOLLECTIVE_TRANSPORT": "tcp"}
    results = run_ranks(BATTERY, 2, ("--quick",), env=env, timeout=170)
    for r in results:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_pycollective_run_tls_needs_nothing_else() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pycollective", "run", "-n", "2", "--tls", str(WORKER), "objects"],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "PYCOLLECTIVE_TRANSPORT": "tcp"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count('"ok": true') == 2, out.stdout


def test_a_sites_own_certificates(tmp_path) -> None:
    cert, key, ca = _site_ca(tmp_path, "site")
    env = {
        "PYCOLLECTIVE_TLS_CERT": cert,
        "PYCOLLECTIVE_TLS_KEY": key,
        "PYCOLLECTIVE_TLS_CA": ca,
        "PYCOLLECTIVE_TRANSPORT": "tcp",
    }
    _ok(run_ranks(WORKER, 2, ("allreduce",), env=env, timeout=150))


def test_a_certificate_of_another_ca_is_refused(tmp_path) -> None:
    cert, key, ca = _site_ca(tmp_path, "site")
    other = _site_ca(tmp_path, "elsewhere")
    env = {"PYCOLLECTIVE_TLS_CA": ca, "PYCOLLECTIVE_TRANSPORT": "tcp", "PYCOLLECTIVE_TIMEOUT": "20"}
    per_rank = {  # rank 0 waits for rank 1 in vain: not for long
        0: {
            "PYCOLLECTIVE_TLS_CERT": cert,
            "PYCOLLECTIVE_TLS_KEY": key,
            "PYCOLLECTIVE_TIMEOUT": "3",
        },
        1: {"PYCOLLECTIVE_TLS_CERT": other[0], "PYCOLLECTIVE_TLS_KEY": other[1]},
    }
    results = run_ranks(WORKER, 2, ("allreduce",), env=env, per_rank_env=per_rank, timeout=100)
    assert results[1].returncode != 0
    assert "TLS handshake failed" in results[1].stderr, results[1].stderr[-2000:]


def test_a_tls_key_readable_by_others_is_refused(tmp_path) -> None:
    cert, key, ca = _site_ca(tmp_path, "site")
    os.chmod(key, 0o644)
    code = "from pycollective import _tls; _tls.from_env()"
    env = {**os.environ, "PYCOLLECTIVE_TLS_CERT": cert, "PYCOLLECTIVE_TLS_KEY": key}
    env["PYCOLLECTIVE_TLS_CA"] = ca
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "mode 0644" in out.stderr


def test_half_a_site_configuration_is_refused_naming_what_is_missing(tmp_path) -> None:
    cert, _key, _ca = _site_ca(tmp_path, "site")
    code = "from pycollective import _tls; _tls.from_env()"
    env = {**os.environ, "PYCOLLECTIVE_TLS_CERT": cert}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "PYCOLLECTIVE_TLS_CA" in out.stderr
