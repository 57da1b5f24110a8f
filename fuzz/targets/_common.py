"""What the targets share: the job's key they use, and a watch on the library's logs."""

from __future__ import annotations

import logging
import socket

SECRET = b"fuzz-secret-0123456789abcdef"


class ErrorLog(logging.Handler):
    """Keeps the library's ERROR records (a server logs a crash of one connection at
    ERROR and goes on: the targets assert there were none) and hides the rest (a refused
    frame is logged at WARNING, thousands of times a second here)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []
        logger = logging.getLogger("pycollective")
        logger.addHandler(self)
        logger.propagate = False

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[str]:
        out = [self.format(r) for r in self.records]
        self.records.clear()
        return out


_listener: socket.socket | None = None


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """(accepted, connected): the two ends of one loopback TCP connection (the store
    sets TCP options a Unix socket pair refuses)."""
    global _listener
    if _listener is None:
        _listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(_listener.getsockname())
    accepted, _ = _listener.accept()
    return accepted, client
