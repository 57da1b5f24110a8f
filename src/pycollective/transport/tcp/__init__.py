"""The TCP transport: `connect_mesh` builds a `TCPTransport` (one connection per pair of
ranks). transport.py is the one entry point (its parts, one concern a file, are listed
there), conn.py holds one connection's state, mesh.py makes the connections."""

from .mesh import connect_mesh
from .transport import MAX_FRAME_BYTES, TCPTransport

__all__ = ["MAX_FRAME_BYTES", "TCPTransport", "connect_mesh"]
