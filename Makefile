# Set-up and test entry points. Everything installs itself: a Python virtual environment from requirements-dev.txt
# (requirements.txt, what running the playbooks needs, and the development tools), a Docker engine from the
# distribution when none answers, a locally built systemd base image, and the cached fixtures (llama.cpp sources from
# PyPI sdists, tiny generated models).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
# The distribution's interpreter: Debian's is built with profile-guided and link-time optimisation, and ran this
# project's Ansible with about a sixth less CPU than a plain source build (pyenv's default, first on PATH on the
# machines the suite is measured on), a pure-Python loop in half the time. On Debian, tools/host-packages.sh brings
# it and its venv module (python3-venv) when missing; elsewhere, it is used where it can make a virtual environment.
# Decided once per make run (a plain `?=` would run the check at every use of PYTHON).
ifeq ($(origin PYTHON),undefined)
PYTHON := $(if $(wildcard /usr/bin/apt-get)$(shell /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null && echo yes),/usr/bin/python3,python3)
endif
export LLAMA_CACHE_DIR ?= /var/cache/llamacpp-rpc-cluster
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
FIXTURES_ENV := .cache/fixtures.env

.PHONY: help venv bytecode docker ssh shellcheck image image-trixie fixtures lint unit checks docs molecule test test-vulkan test-cuda demo bench status collection sanity demo-down clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# The stamp names the interpreter: a virtual environment made by another one is made again.
VENV_STAMP := $(VENV)/.installed$(subst /,_,$(realpath $(shell command -v $(PYTHON))))

$(VENV_STAMP): requirements.txt requirements-dev.txt
	$(if $(wildcard /usr/bin/apt-get),tools/host-packages.sh venv)
	$(PYTHON) -m venv --clear $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

venv: $(VENV_STAMP)  ## the pinned Python toolchain in .venv

# Ansible loads the project's filter and action plugins afresh in the worker it forks for each task and host. Where
# Python may not write bytecode (PYTHONDONTWRITEBYTECODE, set on the machines the suite is measured on), it compiled
# them from source every time: 17 ms of controller CPU per task and host (measured: 40 templated tasks, 3.2 vs 2.5
# CPU-s). Compiled here once; Python still checks each file's mtime, so an edited plugin never runs from stale bytecode.
bytecode: venv  ## the project's controller-side plugins compiled to bytecode once
	$(VENV)/bin/python -m compileall -q plugins/filter plugins/action

docker:  ## a Docker engine that answers (installs docker.io and starts dockerd if needed)
	tools/ensure-docker.sh

ssh:  ## the SSH client the scenarios reach their containers with (installed from the distribution if missing)
	tools/host-packages.sh ssh

shellcheck:  ## Debian's shellcheck, which ansible-test sanity's shellcheck test runs (installed if missing)
	tools/host-packages.sh sanity

image: docker ssh  ## the Debian 12 systemd base image (built once per machine)
	@mkdir -p .cache
	tools/base-image.sh > .cache/base-image

image-trixie: docker ssh  ## the Debian 13 image of the mixed scenario (make test; built once per machine)
	@mkdir -p .cache
	tools/base-image.sh trixie > .cache/base-image-trixie

$(FIXTURES_ENV): venv image tools/fixtures.py tools/make_tiny_model.py
	@mkdir -p .cache
	tools/host-packages.sh fixtures
	$(VENV)/bin/python tools/fixtures.py env > $@.part
	echo "export LLAMA_TEST_IMAGE=$$(cat .cache/base-image)" >> $@.part
	mv $@.part $@

fixtures: $(FIXTURES_ENV)  ## llama.cpp sources and tiny models (cached once per machine)

# The demo's own: one llama.cpp release and the model, not the suite's other releases, git fixture and tiny models.
DEMO_ENV := .cache/fixtures-demo.env
$(DEMO_ENV): venv image tools/fixtures.py
	@mkdir -p .cache
	$(VENV)/bin/python tools/fixtures.py env --demo > $@.part
	echo "export LLAMA_TEST_IMAGE=$$(cat .cache/base-image)" >> $@.part
	mv $@.part $@

lint: venv  ## yamllint + ansible-lint (production profile)
	yamllint --strict .
	ansible-lint --strict

unit: venv shellcheck  ## Python unit tests (planner, filters, actions, role contracts, GGUF reader, model generator)
	source $(FIXTURES_ENV) 2>/dev/null || true; pytest -q tests/unit

docs: venv  ## regenerate the variable tables of the role READMEs from their argument_specs
	$(VENV)/bin/python tools/role_docs.py --write

# The tests that need no container: the inventory preflight tests and the unit tests (tests/ without the scenarios).
checks: lint shellcheck  ## lint, then every test that needs no container (make test runs them beside the scenarios)
	source $(FIXTURES_ENV) 2>/dev/null || true; pytest -v -p no:cacheprovider tests --ignore=tests/test_molecule.py

# The fixtures and the Debian 13 image are made side by side (on a fresh machine, about 2 minutes each, mostly waiting
# on the network and on dpkg); the Debian 12 image first, as both need it or the packages its build installs.
test: venv bytecode shellcheck image  ## everything: the molecule scenarios, and make checks beside them (tools/test-suite.sh)
	$(MAKE) --no-print-directory -j2 --output-sync=target fixtures image-trixie
	tools/host-packages.sh shaping
	source $(FIXTURES_ENV); export LLAMA_TEST_IMAGE_TRIXIE=$$(cat .cache/base-image-trixie); tools/test-suite.sh

test-vulkan: venv bytecode fixtures  ## the Vulkan backend built and run on Mesa's lavapipe (not in `make test`: ~25 min on 2 cores)
	source $(FIXTURES_ENV); LLAMA_OPTIONAL_SCENARIOS=vulkan pytest -v -p no:cacheprovider "tests/test_molecule.py::test_scenario[vulkan]"

test-cuda: venv bytecode fixtures  ## the CUDA backend built and installed (not in `make test`: ~25 min on 2 cores; needs nvcc)
	source $(FIXTURES_ENV); export LLAMA_CUDA_TOOLKIT=$$($(VENV)/bin/python tools/fixtures.py cuda-toolkit); \
	LLAMA_OPTIONAL_SCENARIOS=cuda pytest -v -p no:cacheprovider "tests/test_molecule.py::test_scenario[cuda]"

demo: venv bytecode $(DEMO_ENV)  ## a local 3-container cluster serving a small model through site.yml
	source $(DEMO_ENV); tools/demo.sh up

# P3 makes the demo's containers again (--fresh): the demo is up again afterwards. BENCH_ARGS="--figures P5" skips it.
BENCH_ARGS ?= --fresh
bench: venv bytecode $(DEMO_ENV)  ## the speed figures on the demo cluster (after make demo): bench/<date>-<commit>.md, plots
	tools/host-packages.sh shaping
	source $(DEMO_ENV); $(VENV)/bin/python tools/bench.py $(BENCH_ARGS)

collection: venv  ## the collection llamacpp.rpc_cluster (galaxy.yml) built from this checkout, in .cache/collection
	$(VENV)/bin/python tools/collection.py build

sanity: venv shellcheck  ## ansible-test sanity on the built collection (its requirements from PyPI)
	$(VENV)/bin/python tools/collection.py sanity

status: venv bytecode  ## the demo cluster at a glance: a row per node, then healthy or each problem and its fix
	ansible-playbook playbooks/status.yml -i inventory/demo

demo-down:  ## remove the demo cluster
	tools/demo.sh down

clean: demo-down  ## remove the virtual environment and local caches (not the machine-wide cache)
	rm -rf $(VENV) .cache
