"""A Docker engine for the compose test on a machine that reaches no image registry: the
daemon started when none runs (and stopped again), a Debian base image made with debootstrap
and imported once (kept between runs), and images built with BuildKit.

The docker.io package's own client (/usr/bin/docker) builds: a newer client first on PATH may
lack buildx, and only BuildKit skips the Dockerfile stages a target does not need (the legacy
builder would build the vLLM stage too). ../shared/ENVIRONMENT.md, "Docker", has the facts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.waiting import eventually

DOCKER = "/usr/bin/docker"
# Debian's packages the base image carries: what python:3.11-slim-bookworm gives the
# project's Dockerfile (python, its venv module) and wget, the stand-ins' healthcheck tool.
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates", "wget")
BASE_IMAGE = "inferwatch-test/debian-python:bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def docker(*args: str, check: bool = True, timeout: float = 600, env: dict | None = None
           ) -> subprocess.CompletedProcess:
    result = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout,
                            env=env or os.environ)
    if check and result.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def daemon_answers() -> bool:
    return subprocess.run([DOCKER, "info"], capture_output=True).returncode == 0


@contextmanager
def running_daemon(log: Path) -> Iterator[None]:
    """The engine, for the duration: the one already running, or a dockerd started here as
    root (nothing starts one on these machines) and stopped at the end."""
    if not Path(DOCKER).exists():
        raise RuntimeError(f"{DOCKER} is missing: `make test-compose` installs Debian's docker.io")
    if daemon_answers():
        yield
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(["dockerd"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        eventually(lambda: proc.poll() is not None or daemon_answers(), timeout_s=60, interval_s=0.5)
        if proc.poll() is not None:
            raise RuntimeError(f"dockerd exited ({proc.returncode}); its log: {log}")
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def image_exists(tag: str) -> bool:
    return docker("image", "inspect", tag, check=False).returncode == 0


def ensure_base_image(tag: str = BASE_IMAGE) -> float:
    """A minimal Debian bookworm with Python, made by debootstrap from Debian's packages and
    imported, unless the engine has it already; the seconds it took (0 when cached). The
    host's CA bundle goes in, and pip is pointed at it: PyPI answers through the host's proxy
    CA on these machines (pip's own bundle lacks it). The image stays in the engine's store,
    so later runs skip this."""
    if image_exists(tag):
        return 0.0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="debootstrap-") as tmp:
        root = Path(tmp) / "rootfs"
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", "bookworm",
                        str(root), DEBIAN_MIRROR], check=True, capture_output=True, timeout=900)
        shutil.copyfile(HOST_CA_BUNDLE, root / "etc/ssl/certs/ca-certificates.crt")
        (root / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run([DOCKER, "import", "-", tag], stdin=tar.stdout, check=True, capture_output=True, timeout=600)
        if tar.wait() != 0:
            raise RuntimeError("tar of the debootstrap tree failed")
    return time.monotonic() - started


def build(context: Path, target: str, tag: str, build_args: dict[str, str]) -> float:
    """``docker build`` of one target with BuildKit; the seconds it took."""
    started = time.monotonic()
    args = [a for k, v in build_args.items() for a in ("--build-arg", f"{k}={v}")]
    docker("build", *args, "--target", target, "-t", tag, str(context), timeout=1800,
           env={**os.environ, "DOCKER_BUILDKIT": "1"})
    return time.monotonic() - started


def image_size_mb(tag: str) -> float:
    return int(docker("image", "inspect", tag, "--format", "{{.Size}}").stdout) / 1e6


def bridge_gateway() -> str:
    """The host's address on Docker's default bridge: what ``host.docker.internal`` (the
    ``host-gateway`` of extra_hosts) resolves to in a container."""
    found = json.loads(docker("network", "inspect", "bridge").stdout)[0]
    gateway = found["IPAM"]["Config"][0].get("Gateway")
    if gateway:
        return gateway
    # Docker 20.10 leaves the default bridge's gateway out of IPAM: it is the interface's address
    interface = found["Options"].get("com.docker.network.bridge.name", "docker0")
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show", interface], capture_output=True, text=True, check=True)
    return shown.stdout.split()[3].split("/")[0]
