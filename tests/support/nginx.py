"""Debian's nginx as one process (``master_process off``, so its pid is the one doing the
work) in front of servers on loopback: the test fleet's load balancer and the benchmark's
floor for a proxy's cost."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

CONF = """
master_process off; daemon off; worker_processes 1;
error_log {dir}/error.log warn; pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy; fastcgi_temp_path {dir}/fcgi;
  uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  upstream servers {{ {servers} {keepalive} }}
  server {{
    listen 127.0.0.1:{port};
    location = {health_path} {{ return 200 "ok"; }}
    location / {{
      proxy_pass http://servers; proxy_http_version 1.1; proxy_buffering off; {proxy}
    }}
  }}
}}
"""


def executable() -> str:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(nginx, os.X_OK):
        raise RuntimeError("nginx is not installed: `make install` brings it (Debian's nginx)")
    return nginx


def configure(workdir: Path, port: int, server_ports: Sequence[int], *, health_path: str = "/nginx-health",
              keepalive: int = 0, proxy: str = "") -> list[str]:
    """Write ``workdir/nginx.conf`` (round robin over ``server_ports``, its own answer at
    ``health_path``, ``keepalive`` idle connections kept to them, ``proxy`` extra directives
    for ``location /``); return the command line that runs it, error log in ``workdir``."""
    servers = " ".join(f"server 127.0.0.1:{p};" for p in server_ports)
    kept = f"keepalive {keepalive};" if keepalive else ""
    if keepalive:
        proxy = f'proxy_set_header Connection ""; {proxy}'
    conf = workdir / "nginx.conf"
    conf.write_text(CONF.format(dir=workdir, port=port, servers=servers, keepalive=kept, health_path=health_path,
                                proxy=proxy))
    return [executable(), "-e", str(workdir / "error.log"), "-c", str(conf), "-p", str(workdir)]
