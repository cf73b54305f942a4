"""The gateway's HTTP protocol extends uvicorn's (serving/server.py), which uvicorn does not
document as an API. These tests fail, naming the member, when the installed uvicorn no
longer has what the protocol uses or has changed a method the protocol extends or replaces;
pyproject.toml bounds uvicorn to the versions where they pass."""

import hashlib
import inspect
import tomllib
from pathlib import Path

import pytest
import uvicorn
from packaging.requirements import Requirement
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from inferwatch.serving import server
from inferwatch.serving.server import GatewayHttpProtocol, check_uvicorn

# sha256 (first 16 hex digits) of uvicorn's source of each method GatewayHttpProtocol extends
# (calls through super()), replaces, or calls. After reviewing the override against a new uvicorn's
# code, update the digest and pyproject.toml's range together.
REVIEWED = {
    "connection_made": "6efb565ff3d36b91",
    "connection_lost": "c91a4c9bf2e29c55",
    "data_received": "010a7ae59a5d3b1a",
    "on_message_begin": "96d377fdc7c2baef",
    "on_header": "65d62c044f61fdbd",
    "on_headers_complete": "1ea8589acfad92d8",
    "on_message_complete": "1fbad42dc31fc01f",
    "send_400_response": "ae5a4a3782b646fd",
    "pause_writing": "17a8fd215d96a13c",
    "resume_writing": "7844bbaa8cceb1ef",
    "timeout_keep_alive_handler": "8b53bf5f2e202970",
    "on_response_complete": "64e254f28e389e76",
}


def _digest(method: str) -> str:
    return hashlib.sha256(inspect.getsource(getattr(HttpToolsProtocol, method)).encode()).hexdigest()[:16]


def test_the_installed_uvicorn_is_in_the_range_pyproject_allows():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    (spec,) = [Requirement(d) for d in pyproject["project"]["dependencies"] if d.startswith("uvicorn")]
    assert any(s.operator in ("<", "<=", "==", "~=") for s in spec.specifier), \
        "uvicorn needs an upper bound: the gateway extends its protocol"
    assert spec.specifier.contains(uvicorn.__version__), f"uvicorn {uvicorn.__version__} is outside {spec.specifier}"


@pytest.mark.parametrize("method", sorted(REVIEWED))
def test_each_method_the_protocol_extends_or_replaces_is_the_code_it_was_reviewed_against(method):
    assert _digest(method) == REVIEWED[method], (
        f"uvicorn {uvicorn.__version__} changed HttpToolsProtocol.{method}, which GatewayHttpProtocol "
        f"(inferwatch/serving/server.py) extends or replaces: review the override against uvicorn's new code, "
        f"then update REVIEWED here and the uvicorn range in pyproject.toml")


def test_every_method_the_protocol_overrides_was_reviewed():
    overridden = {name for name, value in vars(GatewayHttpProtocol).items()
                  if callable(value) and hasattr(HttpToolsProtocol, name) and not name.startswith("__")}
    assert overridden <= set(REVIEWED), f"overrides without a reviewed digest: {sorted(overridden - set(REVIEWED))}"


@pytest.mark.parametrize("attribute", server.UVICORN_ATTRIBUTES)
def test_each_attribute_the_protocol_reads_is_set_by_uvicorns_protocol(attribute):
    source = inspect.getsource(HttpToolsProtocol)
    assert f"self.{attribute} =" in source or f"self.{attribute}: " in source, (
        f"uvicorn {uvicorn.__version__}'s HttpToolsProtocol no longer sets self.{attribute}, which "
        "GatewayHttpProtocol reads")


def test_the_gateway_refuses_to_start_on_a_uvicorn_without_a_method_it_uses_and_names_it(monkeypatch):
    check_uvicorn()
    monkeypatch.delattr(HttpToolsProtocol, "on_header")
    with pytest.raises(RuntimeError, match=r"HttpToolsProtocol has no on_header.*pinned in inferwatch's pyproject"):
        check_uvicorn()
