"""Shared by the gateway's tests: a stub upstream per test module (tests/support/stub_upstream.py)."""

import pytest

from tests.support.stub_upstream import StubUpstream


@pytest.fixture(scope="module")
def stub():
    with StubUpstream() as s:
        yield s
