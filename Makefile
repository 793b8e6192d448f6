# Two entry points for a newcomer: `make demo` (the main job) and `make test` (the whole suite).
# Both install what they need into .venv first: the operator (operator/, the product) and the
# test support beside it (testsupport/: the dev control plane and the `dsv4-demo` command, never
# in the operator's wheel or image); `make test` also builds or reuses the Kubernetes test
# binaries (see docs/devcluster.md) and prints where the time went (tools/suite.py).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# tools/suite.py sets DSV4_REPORTS: each pytest stage writes its JUnit XML there.
REPORT = $(if $(DSV4_REPORTS),--junitxml=$(DSV4_REPORTS)/$(1).xml)
# The unit tier on both cores (pytest-xdist); the integration tier on four workers, each with
# its own control plane (its tests mostly wait on the API server and the operator's clocks),
# handed whole modules, longest first (tests/integration/conftest.py says how it orders them).
UNIT_WORKERS ?= 2
INTEGRATION_WORKERS ?= 4

# `make playground`: a local cluster the README's install section runs on as written (see
# testsupport/dsv4_devcluster/playground.py); it prints the shell line to paste.
.PHONY: demo playground test install install-newest lint ruff types k8s-binaries tools conformance-envs unit \
	unit-newest test-chart test-conformance test-integration nightly bench

$(BIN)/dsv4-demo: pyproject.toml testsupport/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]' -e ./testsupport
	touch $@

install: $(BIN)/dsv4-demo

demo: install k8s-binaries tools
	$(BIN)/dsv4 validate -f examples/dsv4-sglang-0.5.23.yaml
	$(BIN)/dsv4 plan -f examples/dsv4-sglang-0.5.23.yaml
	$(BIN)/dsv4-demo

playground: install k8s-binaries tools
	$(BIN)/python -m dsv4_devcluster.playground

lint: ruff types

ruff: install
	$(BIN)/ruff check operator testsupport tests tools bench
	$(BIN)/ruff format --check operator testsupport tests tools bench

types: install
	$(BIN)/mypy

k8s-binaries:
	bash tools/build-k8s.sh

# Pinned helm, kubectl, promtool (Debian package, unpacked) and hadolint for the chart, alert
# and image tests, fetched into ~/.cache/dsv4-operator/tools on first use (tools/devtools.py).
tools: install
	$(BIN)/python tools/devtools.py

# A CPU-only environment per supported SGLang release, with that release's own wheels, for
# tests/conformance (first run: a few minutes, ~6 GB shared between them; reused after),
# installed by uv from tools/conformance-locks/. See tools/conformance_env.py.
conformance-envs: install
	for v in $$($(BIN)/python -c 'from dsv4_operator.engine.releases import supported_versions as s; print(*s())'); do \
		$(BIN)/python tools/conformance_env.py $$v > /dev/null || exit 1; \
	done

unit: install
	$(BIN)/python -m pytest tests/unit -n $(UNIT_WORKERS) $(call REPORT,unit)

# The newest supported Python (pyproject: >=3.11; lint and types run on 3.11, the lowest): the
# unit tier in a venv of its own. A missing interpreter fails; it is never skipped.
# pyenv keeps it under ~/.pyenv/versions (its python3.13 shim fails while 3.11 is the global one).
NEWEST_PYTHON ?= $(or $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13)),$(shell command -v python3.13),python3.13)
NEWEST_VENV := .venv-newest
$(NEWEST_VENV)/.installed: pyproject.toml testsupport/pyproject.toml
	$(NEWEST_PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[test]' -e ./testsupport
	touch $@

install-newest: $(NEWEST_VENV)/.installed

unit-newest: install-newest
	$(NEWEST_VENV)/bin/python -m pytest tests/unit -n $(UNIT_WORKERS) -p no:cacheprovider \
		$(call REPORT,unit-3.13)

test-chart: tools
	$(BIN)/python -m pytest tests/chart $(call REPORT,chart)

# Two workers; each imports a release's sglang once (tests/conformance/release_zygote.py) and
# asks every question of it in a forked child.
test-conformance: conformance-envs
	$(BIN)/python -m pytest tests/conformance -n $(UNIT_WORKERS) $(call REPORT,conformance)

test-integration: install tools k8s-binaries
	$(BIN)/python -m pytest tests/integration -n $(INTEGRATION_WORKERS) --dist loadscope --no-loadscope-reorder \
		$(call REPORT,integration)

# Every stage above, downloads and builds beside the tests, then a table of where the time went.
# pytest exits 5 when it collected nothing; the suite treats any non-zero exit as failure.
test:
	$(PYTHON) tools/suite.py

# The nightly-sized runs (many more hypothesis cases, the soak at full length): hours, not CI.
nightly: install tools k8s-binaries
	$(BIN)/python -m pytest -m nightly tests $(call REPORT,nightly)

bench: install k8s-binaries
	$(BIN)/python bench/apply_to_children.py
