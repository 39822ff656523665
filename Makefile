# Everyday commands. `make` alone lists them. Tools come from the checkout's .venv (the README's
# set-up line creates it); `make VENV=/path/to/venv ...` uses another one.
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST := $(BIN)/pytest

# Test groups are pytest markers (pyproject.toml, recon_dagster_tests/support/markers.py):
# postgres, daemon, browser, slow. The default run and CI take every group.
FAST := not daemon and not browser and not slow

.DEFAULT_GOAL := help
.PHONY: help test test-fast test-slow test-nodb test-node lint format demo docs ci

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

test: ## the whole suite, every group (what CI runs, twice)
	$(PYTEST)

test-fast: ## without the daemon, browser and slow groups: the loop while coding
	$(PYTEST) -m "$(FAST)"

test-slow: ## only the daemon, browser and slow groups
	$(PYTEST) -m "not ($(FAST))"

test-nodb: ## only the tests that need no PostgreSQL, daemon or browser
	$(PYTEST) -m "$(FAST) and not postgres"

# The same commands .ci/run runs for clients/node: Node 20+, Redis on 127.0.0.1:6379 and the server
# PostgreSQL (RECON_DATABASE_URL, default the machine's 127.0.0.1:5432); the tests use this .venv.
test-node: ## the Node package (clients/node): npm ci, type-check, conformance table, BullMQ end to end
	cd clients/node && npm ci --no-audit --no-fund && npx tsc --noEmit -p . \
	  && RECON_DATABASE_URL="$${RECON_DATABASE_URL:-postgresql://root@127.0.0.1:5432/postgres}" npm test

lint: ## ruff (lint and format), mypy, the import layers, squawk over migrations/
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy recon_dagster
	$(BIN)/lint-imports
	$(BIN)/squawk --reporter gcc migrations/*.sql

format: ## ruff format, then ruff's safe fixes
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

demo: ## the incident, reconciled on the embedded PostgreSQL and the sandbox
	$(BIN)/recon-dagster demo

docs: ## regenerate docs/configuration.md (recon_dagster/config/) and the metrics of docs/operations.md
	$(BIN)/python -m recon_dagster.config --markdown > docs/configuration.md.tmp
	mv docs/configuration.md.tmp docs/configuration.md
	$(BIN)/python -m recon_dagster.telemetry.docs docs/operations.md

ci: ## what CI runs: install, lint, the suite on the embedded and the server PostgreSQL
	bash .ci/run
