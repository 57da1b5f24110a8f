"""Fixtures the transport tests share."""

import pytest
from tests.transport.test_conformance import _mesh


@pytest.fixture
def pair():
    """Two TCP transports meshed over loopback, closed after the test."""
    ts = _mesh(2)
    yield ts
    for t in ts:
        t.close()
