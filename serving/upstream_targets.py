"""Where a variant's vLLM replicas are: the URLs configured, and the addresses their names
resolve to.

An upstream is one base URL or several, comma-separated (``http://vllm-0:8000,http://vllm-1:8000``).
A name is resolved to every address it has, and again every so often, so a Kubernetes
headless Service (one A record per ready pod) spreads the load over its pods and follows
them as they come and go; a ClusterIP Service resolves to one address and stays one
replica behind kube-proxy.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Target:
    """One configured base URL."""

    url: str
    scheme: str
    host: str  # a name, or an address literal
    netloc: str  # the Host header: the URL's host[:port]
    port: int
    prefix: str  # the path before /v1/..., without a trailing slash

    @property
    def literal(self) -> bool:
        """An address, not a name: nothing to resolve."""
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True


@dataclass(frozen=True)
class Address:
    """A replica: one address of one target."""

    target: Target
    ip: str

    @property
    def key(self) -> str:
        """``ip:port``: the endpoint label, and how replicas are told apart."""
        return f"[{self.ip}]:{self.target.port}" if ":" in self.ip else f"{self.ip}:{self.target.port}"

    @property
    def url(self) -> str:
        """The target's URL with the address for its host (sent with the target's Host header)."""
        return f"{self.target.scheme}://{self.key}{self.target.prefix}"


def normalize_upstream(value: object) -> str:
    """One URL, several comma-separated, or a list of them: the canonical comma-joined form
    (no trailing slashes), or a ValueError that says what is wrong."""
    parts = value if isinstance(value, list) else str(value).split(",") if isinstance(value, str) else None
    if parts is None:
        raise ValueError("must be a URL, several separated by commas, or a list of URLs")
    urls = [str(p).strip().rstrip("/") for p in parts if str(p).strip()]
    if not urls:
        raise ValueError("needs at least one http(s):// URL")
    for url in urls:
        parse_target(url)
    if len(set(urls)) != len(urls):
        raise ValueError("a URL is listed twice: that replica would get twice the share of requests")
    return ",".join(urls)


def parse_target(url: str) -> Target:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"each upstream URL must start with http:// or https://; got {url[:100]!r}")
    if any(c.isspace() for c in url):
        raise ValueError(f"an upstream URL has a space in it; separate several with commas: {url[:100]!r}")
    try:
        split = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"an upstream URL cannot be parsed ({exc}): {url[:100]!r}") from None
    try:
        port = split.port if split.port is not None else (443 if split.scheme == "https" else 80)
        if port == 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"an upstream URL has a port that is not a number from 1 to 65535: {url[:100]!r}") from None
    if not split.hostname:
        raise ValueError(f"an upstream URL has no host: {url[:100]!r}")
    if split.query or split.fragment:
        raise ValueError(f"an upstream URL is a base URL, without ?query or #fragment: {url[:100]!r}")
    if split.username or split.password:
        raise ValueError(f"an upstream URL carries no credentials; set INFERWATCH_GATEWAY_UPSTREAM_API_KEY instead: "
                         f"{split.scheme}://{split.hostname}...")
    return Target(url, split.scheme, split.hostname, split.netloc, port, split.path.rstrip("/"))


def parse_upstream(spec: str) -> tuple[Target, ...]:
    return tuple(parse_target(u) for u in normalize_upstream(spec).split(","))


def one_family(infos: list[tuple]) -> list[str]:
    """The distinct addresses of one family, in the resolver's order: IPv4 when the name has
    any, else IPv6. A dual-stack pod has an address of each and is one replica, not two
    (and ``localhost`` is one server, not 127.0.0.1 and ::1)."""
    v4 = [info[4][0] for info in infos if info[0] == socket.AF_INET]
    v6 = [info[4][0] for info in infos if info[0] == socket.AF_INET6]
    return list(dict.fromkeys(v4 or v6))


async def resolve(target: Target) -> list[Address]:
    """The target's addresses now; an OSError (socket.gaierror) when the name has none."""
    if target.literal:
        return [Address(target, target.host)]
    infos = await asyncio.get_running_loop().getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    return [Address(target, ip) for ip in one_family(infos)]
