"""etcd endpoints as a job names them ("h1:2379,https://h2:2379"), parsed.

Apart from the client (_etcd_client.py, which imports http.client, ssl and email) so
that `pycollective run` can check its --rdzv-endpoint without loading the client: every
launcher process starts faster (pycollective._lazy says why that counts)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._errors import UsageError


@dataclass(frozen=True)
class Endpoint:
    scheme: str  # "http" or "https"
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_endpoints(text: str | Sequence[str], *, tls: bool = False) -> list[Endpoint]:
    """ "h1:2379,h2:2379" or ["https://h1:2379", ...] -> endpoints (port 2379 if omitted)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        scheme = "https" if tls else "http"
        if "://" in item:
            scheme, _, item = item.partition("://")
            if scheme not in ("http", "https"):
                raise UsageError(f"etcd endpoint {raw!r}: the scheme must be http or https")
        item = item.rstrip("/")
        if item.startswith("["):  # [v6]:port
            host, _, rest = item[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        else:
            host, sep, port_text = item.rpartition(":")
            if not sep:
                host, port_text = item, ""
        try:
            port = int(port_text) if port_text else 2379
        except ValueError:
            raise UsageError(f"etcd endpoint {raw!r}: bad port {port_text!r}") from None
        if not host or not 0 < port < 65536:
            raise UsageError(f"etcd endpoint {raw!r}: expected HOST[:PORT]")
        out.append(Endpoint(scheme, host, port))
    if not out:
        raise UsageError(f"no etcd endpoint in {text!r} (expected HOST:PORT[,HOST:PORT...])")
    return out
