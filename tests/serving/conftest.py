"""Shared by the gateway's tests: a stub upstream per test module (tests/support/stub_upstream.py)
and an OTLP receiver per test."""

import pytest

from tests.support.otlp import OTLPReceiver
from tests.support.stub_upstream import StubUpstream


@pytest.fixture(scope="module")
def stub():
    with StubUpstream() as s:
        yield s


@pytest.fixture
def receiver():
    r = OTLPReceiver()
    yield r
    r.close()
