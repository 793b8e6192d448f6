# Two entry points for a newcomer: `make demo` (the main job) and `make test` (the whole suite).
# Both install what they need into .venv first: the operator (operator/, the product) and the
# test support beside it (testsupport/: the dev control plane and the `dsv4-demo` command, never
# in the operator's wheel or image); `make test` also builds or reuses the Kubernetes test
# binaries (see docs/devcluster.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install lint k8s-binaries tools conformance-envs unit unit-newest bench

$(BIN)/dsv4-demo: pyproject.toml testsupport/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]' -e ./testsupport
	touch $@

install: $(BIN)/dsv4-demo

demo: install k8s-binaries
	$(BIN)/dsv4 validate -f examples/dsv4.yaml
	$(BIN)/dsv4 plan -f examples/dsv4.yaml
	$(BIN)/dsv4-demo

lint: install
	$(BIN)/ruff check operator testsupport tests tools bench
	$(BIN)/ruff format --check operator testsupport tests tools bench
	$(BIN)/mypy

k8s-binaries:
	bash tools/build-k8s.sh

# Pinned helm, kubectl, promtool (Debian package, unpacked) and hadolint for the chart, alert
# and image tests, fetched into ~/.cache/dsv4-operator/tools on first use (tools/devtools.py).
tools: install
	$(BIN)/python tools/devtools.py

# A CPU-only environment per supported SGLang release, with that release's own wheels, for
# tests/conformance (first run: minutes and ~6 GB each; reused after). See tools/conformance_env.py.
conformance-envs: install
	for v in $$($(BIN)/python -c 'from dsv4_operator.engine.releases import supported_versions as s; print(*s())'); do \
		$(PYTHON) tools/conformance_env.py $$v > /dev/null || exit 1; \
	done

unit: install
	$(BIN)/python -m pytest tests/unit

# The newest supported Python (pyproject: >=3.11; lint and types run on 3.11, the lowest): the
# unit tier in a venv of its own. A missing interpreter fails; it is never skipped.
# pyenv keeps it under ~/.pyenv/versions (its python3.13 shim fails while 3.11 is the global one).
NEWEST_PYTHON ?= $(or $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13)),$(shell command -v python3.13),python3.13)
NEWEST_VENV := .venv-newest
$(NEWEST_VENV)/.installed: pyproject.toml testsupport/pyproject.toml
	$(NEWEST_PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[test]' -e ./testsupport
	touch $@

unit-newest: $(NEWEST_VENV)/.installed
	$(NEWEST_VENV)/bin/python -m pytest tests/unit -p no:cacheprovider

# pytest exits 5 when it collected nothing; make treats any non-zero exit as failure.
test: install lint k8s-binaries tools conformance-envs unit-newest
	$(BIN)/python -m pytest

bench: install k8s-binaries
	$(BIN)/python bench/apply_to_children.py
