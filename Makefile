# dualsched — the two commands that matter:
#   make up     set up everything and run the dev stack (tools, local cluster, pulumi up)
#   make test   run every test tier: unit, real Slurm, real Pulumi engine + API server, real node, real multi-node
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TOOLS_CACHE ?= $(HOME)/.cache/dualsched-tools
# real nodes of `make up`'s cluster, each in network and mount namespaces of its own (tools/node.sh)
NODES ?= 4
export DUALSCHED_TOOLS_CACHE := $(TOOLS_CACHE)

.PHONY: help venv render render-prod tools cluster cluster-down up down slurm-deps checkov \
        test test-unit test-slurm test-e2e test-node test-multinode images bench bench-engine clean package-schema dist

help:
	@sed -n '2,4p' Makefile

# locked: `make test`'s two lanes both make it (the second waits, then finds it installed)
$(STAMP): requirements.txt requirements-dev.txt policy/requirements.txt pyproject.toml
	@echo "[venv] creating $(VENV) and installing pinned requirements"
	flock $(VENV).lock sh -c '$(PYTHON) -m venv $(VENV) && $(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt'
	@touch $(STAMP)

venv: $(STAMP)

## Offline render of a stack (no cluster): every object as YAML under build/<stack>
render: venv
	$(PY) -m dualsched.components.render --stack dev --out build/dev

render-prod: venv
	$(PY) -m dualsched.components.render --stack prod --out build/prod

## Toolchain from Go modules (cached in $(TOOLS_CACHE), keyed by version)
tools:
	tools/build-tools.sh

# the control plane without fake nodes, and $(NODES) real nodes joined to it (with the images built)
cluster: tools images
	tools/cluster.sh up none
	DUALSCHED_NODES=$(NODES) tools/node.sh up

cluster-down:
	tools/node.sh down
	tools/cluster.sh down

up: venv tools cluster
	tools/up.sh

# destroys the stack, then stops the nodes and the control plane: nothing of `make up` keeps running
down: venv
	if tools/cluster.sh status >/dev/null 2>&1; then tools/up.sh destroy; fi
	$(MAKE) cluster-down

slurm-deps:
	scripts/install-slurm.sh

checkov:
	scripts/install-checkov.sh

## Tests
# UNIT_SHARD=K/N runs every N-th test from the K-th on (tests/conftest.py): `make test` runs one half in each lane
test-unit: venv checkov
	DUALSCHED_TEST_SHARD=$(UNIT_SHARD) $(PY) -m pytest -m "not slurm and not e2e and not node and not multinode"

test-slurm: venv slurm-deps
	$(PY) -m pytest -m slurm tests/slurm

# the e2e tier starts (and stops) its own private cluster: it never touches `make up`'s
test-e2e: venv tools
	$(PY) -m pytest -m e2e tests/e2e

# the real-node tier starts (and stops) a control plane and a real node of its own
test-node: venv tools images
	$(PY) -m pytest -m node tests/node

# the real multi-node tier: a control plane and four namespaced real nodes of its own
test-multinode: venv tools images
	$(PY) -m pytest -m multinode tests/multinode

## Container images of the real node, from Debian packages (cached in $(TOOLS_CACHE)/images)
# slurmd-pyxis builds Pyxis against the host's libslurm-dev (slurm-deps); torch is the Enroot image of the
# seed's training job (examples/train_multinode.sbatch)
images: slurm-deps
	tools/images.sh build
	DUALSCHED_SLURM_SUITE=forky tools/images.sh build slurm
	tools/images.sh squashfs torch

# every tier, with what each needs installed and built, in two lanes: the toolchain, then the one-node real
# and e2e tiers; beside them the venv, Debian's Slurm, checkov, the images, the unit and Slurm tiers, then the
# multi-node tier (tools/test-tiers.sh says why that is safe and how the output reads)
test:
	MAKE="$(MAKE)" tools/test-tiers.sh

## A release's sdist and wheel in dist/, checked as a package index checks them (tests/test_packaging.py too)
dist: venv
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(PY) -m twine check --strict dist/*

## The component package's generated input types and schema (package/, docs/component-package.md)
package-schema: venv
	$(PY) -m dualsched.package.gen_types

bench: venv
	$(PY) -m bench.bench
	@if [ -f bench/engine-results.json ]; then $(PY) -m bench.engine --report-only --no-write; fi

# through the real engine and a private local control plane with KWOK nodes (256, 1,024, 4,096 GPU nodes);
# waits for the real-cluster lock other tiers take too; writes bench/ENGINE-RESULTS.md (docs/benchmark.md)
bench-engine: venv tools
	flock /tmp/dualsched-realtier.lock $(PY) -m bench.engine $(BENCH_ENGINE_ARGS)

clean:
	rm -rf build dist $(VENV)
