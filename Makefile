# sglfleet: `make demo` runs the main job end to end on the lab; `make test` runs every check.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
PLAYBOOKS := $(wildcard playbooks/*.yml testing/playbooks/*.yml)
PYTEST_FLAGS ?=
# The lab's sessions print their slowest steps: where their time goes, run by run.
LAB_PYTEST_FLAGS := --durations=30

.PHONY: help deps deps-lab venv docs-pictures lint sanity collection gpu-check test test-unit test-playbooks test-lab test-labs test-integration test-integration-ct200 test-integration-ct201 test-integration-ct202 demo demo-summary lab-up lab-down lab-status clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-24s %s\n", $$1, $$2}'

deps: ## install the Debian packages the venv needs (scripts/install-deps; a no-op when all are there)
	@scripts/install-deps

deps-lab: ## ...and those the lab needs too: lxc, debootstrap, ... (scripts/install-deps --lab)
	@scripts/install-deps --lab

$(VENV)/.installed: requirements.txt requirements-dev.txt python/pyproject.toml testing/pyproject.toml | deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt -e "python[mix,hf,pve,plot]" -e "testing[lab]"
	touch $@

venv: $(VENV)/.installed ## create .venv with the pinned requirements and sglfleet (editable)

docs-pictures: venv ## draw docs/pictures/*.png from a real mix, job and merge (stand-ins on loopback, about a minute)
	$(PY) scripts/docs-pictures

# $(call timed,NAME) COMMAND: run COMMAND (bash's `time`) and print "== NAME: <seconds> s (CPU <user + sys> s)" when
# it is done: the wall-clock time, and the CPU time of every process it waited for.
timed = TIMEFORMAT='== $(1): %1R s (CPU %1U + %1S s)'; time
# The lab is one resource per machine: whoever uses it holds this lock (the test sessions take it themselves).
LAB_LOCK := /tmp/sglfleet-lab.lock
# Jobs of `make test`: lint, the unit tests and the lab's tests run side by side.
TEST_JOBS ?= 4
# The integration modules that can run on a lab CT of their own (SGLFLEET_TEST_CT) do, beside the others on CT 200.
CT201_TESTS := tests/integration/test_toolchain.py tests/integration/test_sglang_role.py tests/integration/test_doctor.py
CT202_TESTS := tests/integration/test_host_phase.py tests/integration/test_site.py tests/integration/test_two_hosts.py

lint: venv ## ruff, yamllint, ansible-lint (production), syntax-check of every playbook, ansible-test sanity
	$(call timed,ruff check) $(BIN)/ruff check .
	$(call timed,ruff format) $(BIN)/ruff format --check .
	$(call timed,yamllint) $(BIN)/yamllint --strict .
	@# Plain, with the repository's own config (.ansible-lint, ansible.cfg): its syntax checks name no inventory,
	@# which ansible.cfg's guard (inventory_plugins/none.yml) reads as empty for a --syntax-check only.
	$(call timed,ansible-lint) $(BIN)/ansible-lint --offline
	@# One ansible-playbook process checks them all: one start-up instead of one per playbook.
	$(call timed,syntax-check) $(BIN)/ansible-playbook --syntax-check -i inventory/lab $(PLAYBOOKS)
	@# ansible-test builds its own venv on a fresh machine (measured 70 s cold, 25-45 s warm).
	$(call timed,sanity) scripts/collection-sanity

sanity: venv ## ansible-test sanity --test validate-modules on the collection (scripts/build-collection), installed
	scripts/collection-sanity

collection: venv ## build the collection sglfleet.ops (build/sglfleet-ops-VERSION.tar.gz) and install it into build/installed
	scripts/build-collection --install build/installed

# The python that has torch and Triton on the GPU machine (the JIT python); "true" or "false" (declares no GPU).
GPU_PYTHON ?= python3
GPUS_EXPECTED ?= true

gpu-check: venv ## on a machine with an NVIDIA GPU: the roles' GPU checks, one row each (docs/gpu-check.md)
	$(PY) scripts/gpu-check --download .gpu
	$(PY) scripts/gpu-check --wheels .gpu/all --python $(GPU_PYTHON) --gpus-expected $(GPUS_EXPECTED)

test-unit: venv ## fast tests: no lab needed
	$(call timed,test-unit) $(BIN)/pytest tests/unit $(PYTEST_FLAGS)

test-playbooks: venv ## ansible-playbook runs that need no lab CT (local connection, fakepve of their own, the collection): no root, no lab lock
	$(call timed,test-playbooks) $(BIN)/pytest tests/playbooks $(PYTEST_FLAGS)

test-lab: deps-lab venv lab-up ## the lab's own smoke tests (needs root)
	$(call timed,test-lab) $(BIN)/pytest tests/lab $(LAB_PYTEST_FLAGS) $(PYTEST_FLAGS)

# Three sessions side by side under one hold of the lab lock (each sees that its ancestor holds it), one per lab
# CT: the role tests on CT 201 (real nvcc and ptxas runs, mostly CPU), the host phase and site.yml on CT 202
# (the only ones to use the stand-in node), the rest on CT 200 (mostly waiting on systemd, health gates and
# warm-ups). The lab is up before the lock is taken; a session alone brings it up itself when it is not (a
# `make lab-up` under the lock would wait for the lock forever).
test-integration: venv lab-up ## ansible-playbook runs against the lab (needs root): the CT 200, 201 and 202 sessions side by side
	$(call timed,test-integration) flock $(LAB_LOCK) $(MAKE) --no-print-directory -j3 --output-sync=target \
	  test-integration-ct200 test-integration-ct201 test-integration-ct202

test-integration-ct200: venv ## the integration modules on CT 200 (all but those of ct201 and ct202)
	$(call timed,test-integration-ct200) $(BIN)/pytest tests/integration \
	  $(addprefix --ignore=,$(CT201_TESTS) $(CT202_TESTS)) $(LAB_PYTEST_FLAGS) $(PYTEST_FLAGS)

test-integration-ct201: venv ## the role tests (cuda_toolchain, sglang) on CT 201
	$(call timed,test-integration-ct201) SGLFLEET_TEST_CT=201 $(BIN)/pytest $(CT201_TESTS) $(LAB_PYTEST_FLAGS) $(PYTEST_FLAGS)

test-integration-ct202: venv ## phase host (the stand-in node), then site.yml, on CT 202
	$(call timed,test-integration-ct202) SGLFLEET_TEST_CT=202 $(BIN)/pytest $(CT202_TESTS) $(LAB_PYTEST_FLAGS) $(PYTEST_FLAGS)

test-labs: venv ## lab-up, the lab's own tests, then the integration tests: everything that needs the lab, in order
	@# -j1: one after the other, whatever -j the make above runs with (its jobserver would be shared).
	$(MAKE) --no-print-directory -j1 test-lab test-integration

# Lint, the unit tests and the playbook tests need neither the lab nor each other; the lab's tests spend most of their time waiting
# (debootstrap's downloads, container boots, systemd, health gates). All four run side by side, each one's
# output printed whole when it ends.
test: deps-lab venv ## every check (installs missing Debian packages first): lint, unit tests and the lab's tests side by side
	$(call timed,make test) $(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target lint test-unit test-playbooks test-labs

lab-up: deps-lab venv ## bring up the lab (fakepve on 127.0.0.1:8006, the LXC template); a no-op when it is up
	$(call timed,lab-up) flock $(LAB_LOCK) $(PY) -m sglfleet_testing.lab up

lab-down: venv ## remove every container, process and file the lab made
	flock $(LAB_LOCK) $(PY) -m sglfleet_testing.lab down

lab-status: venv ## say what of the lab is running
	$(PY) -m sglfleet_testing.lab status

DEMO_OUT := out/lab

demo: deps-lab venv lab-up ## the main job end to end on the lab: site.yml, then where the outputs are and the headline numbers
	@# CT 200 first, then a stand-in training job in it, so that phase training_stop has work to do.
	$(BIN)/ansible-playbook -i inventory/lab playbooks/provision.yml
	$(BIN)/ansible-playbook -i inventory/lab testing/playbooks/lab_trainer.yml
	@start=$$(date +%s); $(BIN)/ansible-playbook -i inventory/lab playbooks/site.yml; \
	  echo; echo "site.yml took $$(( $$(date +%s) - start )) s"
	@$(MAKE) --no-print-directory demo-summary

demo-summary: ## where the demo's outputs are, and the mix and merge reports' headline numbers
	@echo; echo "== Outputs (controller: $(DEMO_OUT)/; fleet host ct200: /var/lib/sglfleet/)"
	@echo "  prompts       $(DEMO_OUT)/prompts.jsonl ($$(wc -l < $(DEMO_OUT)/prompts.jsonl) rows; on ct200: /var/lib/sglfleet/prompts.jsonl)"
	@echo "  results       $(DEMO_OUT)/results.jsonl ($$(wc -l < $(DEMO_OUT)/results.jsonl) rows; on ct200: /var/lib/sglfleet/generated.jsonl + .manifest.json)"
	@echo "  merged set    $(DEMO_OUT)/merged.jsonl ($$(wc -l < $(DEMO_OUT)/merged.jsonl) rows)"
	@echo "  reports       $(DEMO_OUT)/mix-report.{md,json} $(DEMO_OUT)/merge-report.{md,json}"
	@echo "  ledger        ct200:/var/lib/sglfleet/ledger.json (checklist above: ansible-playbook -i inventory/lab playbooks/status.yml)"
	@echo; echo "== Prompt mix ($(DEMO_OUT)/mix-report.md)"; sed -n '3p;/^## Category shares/,$$p' $(DEMO_OUT)/mix-report.md
	@echo; echo "== Merge ($(DEMO_OUT)/merge-report.md)"; sed -n '3,9p;/^## Category shares/,$$p' $(DEMO_OUT)/merge-report.md

clean: lab-down ## lab-down, then remove the venv
	rm -rf $(VENV)
