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
PLAYBOOKS := $(wildcard playbooks/*.yml)
PYTEST_FLAGS ?=

.PHONY: help deps venv lint sanity collection test test-unit test-lab test-integration demo demo-summary lab-up lab-down lab-status clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

deps: ## install the Debian packages the venv and the lab need (scripts/install-deps; a no-op when all are there)
	@scripts/install-deps

$(VENV)/.installed: requirements.txt requirements-dev.txt python/pyproject.toml testing/pyproject.toml | deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt -e "python[mix,hf,pve]" -e "testing[lab]"
	touch $@

venv: $(VENV)/.installed ## create .venv with the pinned requirements and sglfleet (editable)

lint: venv ## ruff, yamllint, ansible-lint (production), syntax-check of every playbook
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/yamllint --strict .
	$(BIN)/ansible-lint --offline
	@for pb in $(PLAYBOOKS); do \
	  echo "syntax-check $$pb"; $(BIN)/ansible-playbook --syntax-check -i inventory/lab $$pb >/dev/null; \
	done

# Not part of lint: ansible-test builds its own venv on a fresh machine (measured 70 s cold, 25-30 s warm).
sanity: venv ## ansible-test sanity --test validate-modules on the collection built from library/ and roles/
	scripts/collection-sanity

collection: venv ## build the collection sglfleet.fleet (build/sglfleet-fleet-VERSION.tar.gz) and install it into build/installed
	scripts/build-collection --install build/installed

test-unit: venv ## fast tests: no lab needed
	$(BIN)/pytest tests/unit $(PYTEST_FLAGS)

test-lab: venv lab-up ## the lab's own smoke tests (needs root)
	$(BIN)/pytest tests/lab $(PYTEST_FLAGS)

test-integration: venv lab-up ## ansible-playbook runs against the lab (needs root)
	$(BIN)/pytest tests/integration $(PYTEST_FLAGS)

test: deps lint test-unit test-lab test-integration ## every check: lint, unit, lab, integration (installs missing Debian packages first)

lab-up: venv ## bring up the lab (fakepve on 127.0.0.1:8006, the LXC template); a no-op when it is up
	$(PY) -m sglfleet_testing.lab up

lab-down: venv ## remove every container, process and file the lab made
	$(PY) -m sglfleet_testing.lab down

lab-status: venv ## say what of the lab is running
	$(PY) -m sglfleet_testing.lab status

DEMO_OUT := out/lab

demo: deps venv lab-up ## the main job end to end on the lab: site.yml, then where the outputs are and the headline numbers
	@# CT 200 first, then a stand-in training job in it, so that phase training_stop has work to do.
	$(BIN)/ansible-playbook -i inventory/lab playbooks/provision.yml
	$(BIN)/ansible-playbook -i inventory/lab playbooks/lab_trainer.yml
	@start=$$(date +%s); $(BIN)/ansible-playbook -i inventory/lab playbooks/site.yml; \
	  echo; echo "site.yml took $$(( $$(date +%s) - start )) s"
	@$(MAKE) --no-print-directory demo-summary

demo-summary: ## where the demo's outputs are, and the mix and merge reports' headline numbers
	@echo; echo "== Outputs (controller: $(DEMO_OUT)/; fleet host ct200: /var/lib/sglfleet/)"
	@echo "  prompts       $(DEMO_OUT)/prompts.jsonl ($$(wc -l < $(DEMO_OUT)/prompts.jsonl) rows; on ct200: /var/lib/sglfleet/prompts.jsonl)"
	@echo "  results       $(DEMO_OUT)/results.jsonl ($$(wc -l < $(DEMO_OUT)/results.jsonl) rows; on ct200: /var/lib/sglfleet/generated.jsonl + .manifest.json)"
	@echo "  merged set    $(DEMO_OUT)/merged.jsonl ($$(wc -l < $(DEMO_OUT)/merged.jsonl) rows)"
	@echo "  reports       $(DEMO_OUT)/mix-report.{md,json} $(DEMO_OUT)/merge-report.{md,json}"
	@echo "  ledger        ct200:/var/lib/sglfleet/ledger.json (checklist above: ansible-playbook playbooks/status.yml)"
	@echo; echo "== Prompt mix ($(DEMO_OUT)/mix-report.md)"; sed -n '3p;/^## Category shares/,$$p' $(DEMO_OUT)/mix-report.md
	@echo; echo "== Merge ($(DEMO_OUT)/merge-report.md)"; sed -n '3,9p;/^## Category shares/,$$p' $(DEMO_OUT)/merge-report.md

clean: lab-down ## lab-down, then remove the venv
	rm -rf $(VENV)
