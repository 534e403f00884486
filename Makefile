# Two commands matter: `make run` (install + start engine and facade) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PROTO_SRC := protos/vlmserve/engine/v1/engine.proto

# mlx's Linux CPU wheel links reference BLAS; Debian's OpenBLAS is ~15-20x faster.
OPENBLAS := $(firstword $(wildcard /usr/lib/*/openblas-pthread/libblas.so.3))
ifneq ($(OPENBLAS),)
export LD_PRELOAD := $(OPENBLAS)$(if $(LD_PRELOAD), $(LD_PRELOAD))
endif

ENGINE_ADDR ?= 127.0.0.1:50051
FACADE_HOST ?= 127.0.0.1
FACADE_PORT ?= 8000
MODEL ?=

.PHONY: install system-deps run engine facade demo test test-fast lint proto proto-ts proto-check buf-lint buf-breaking contract-release node-deps dist clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@bash scripts/install-system-deps.sh
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

system-deps:
	@bash scripts/install-system-deps.sh

# Engine + facade together, on the committed fixture model unless MODEL is set. Several models,
# one engine each: MODELS=id=path,id2=path2 (or MODELS_FILE=models.toml; docs/deployment.md).
# RUN_ARGS: more launcher/facade flags (vlmserve serve --help). `vlmserve serve` is this, installed.
run: install
	$(BIN)/python -m vlmserve.cli serve --engine-address $(ENGINE_ADDR) \
		--host $(FACADE_HOST) --port $(FACADE_PORT) $(if $(MODEL),--model $(MODEL)) \
		$(if $(MODELS),--models $(MODELS)) $(if $(MODELS_FILE),--models-file $(MODELS_FILE)) $(RUN_ARGS)

engine: install
	$(BIN)/vlmserve-engine --address $(ENGINE_ADDR) $(if $(MODEL),--model $(MODEL))

facade: install
	$(BIN)/vlmserve-facade --engine-address $(ENGINE_ADDR) --host $(FACADE_HOST) --port $(FACADE_PORT)

# With `make run` up: draw a squares image, ask the model, print the expected and the given answer.
# DEMO=beeps (with `make run MODEL=models/beeps-audio`): a clip of beeps, heard (training/ask_beeps.py).
# DEMO=video (with `make run MODEL=models/squares-video`): a clip of a square changing colour, watched
# (training/ask_video.py).
DEMO ?= squares
DEMOS := squares beeps video
demo: install
	$(if $(filter-out $(DEMOS),$(DEMO)),$(error DEMO=$(DEMO) is not a demo: one of $(DEMOS)))
	$(BIN)/python -m training.ask_$(DEMO) --url http://$(FACADE_HOST):$(FACADE_PORT) $(DEMO_ARGS)

# The Codex CLI tests need the pinned npm packages; without npm they skip (CI installs npm).
test: install $(if $(shell command -v npm),node-deps)
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The inner loop: every test that loads no real model and starts no process (marker
# `needs_model`, tests/conftest.py), not the `slow` ones; about a minute and a half on 2 cores.
# `make test` runs everything (CI does). Runs on every core (pytest-xdist); tests/_marker_guard.py
# fails a test that loads a model or starts a process without the marker.
test-fast: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -n auto --dist loadgroup -m "not slow and not needs_model" tests $(PYTEST_ARGS)

proto: install
	$(BIN)/python -m grpc_tools.protoc -I protos \
		--plugin=protoc-gen-mypy=$(BIN)/protoc-gen-mypy \
		--plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc \
		--python_out=clients --grpc_python_out=clients \
		--mypy_out=clients --mypy_grpc_out=clients \
		$(PROTO_SRC)

# The contract's TypeScript stubs (protoc-gen-es, pinned in package.json) for clients/typescript.
proto-ts: node-deps
	npx --no-install buf generate --template clients/typescript/buf.gen.yaml

# Fails when the committed generated code (Python and TypeScript) differs from what
# `make proto` and `make proto-ts` write.
proto-check: proto proto-ts
	@git diff --exit-code --stat -- clients/vlmserve/engine clients/typescript/src/gen || \
		(echo "generated code is stale: run 'make proto proto-ts' and commit" >&2; exit 1)
	@test -z "$$(git status --porcelain -- clients/vlmserve/engine clients/typescript/src/gen)" || \
		(echo "untracked generated files: run 'make proto proto-ts' and commit" >&2; exit 1)

node-deps: node_modules/.stamp

node_modules/.stamp: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

buf-lint: node-deps
	npx --no-install buf lint

# The contract against its last released state (protos/released/engine-v1.binpb), buf's FILE
# rules, with the reviewed exceptions in protos/released/accepted-breaks.json (docs/engine-contract.md).
buf-breaking: install node-deps
	$(BIN)/python -m scripts.contract_breaking

# On a release: record the contract at REF (a commit or tag) as the released one, then empty
# protos/released/accepted-breaks.json's list (those changes are now the baseline).
contract-release: node-deps
	@test -n "$(REF)" || { echo "usage: make contract-release REF=<commit or tag>" >&2; exit 2; }
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
		git archive "$(REF)" protos buf.yaml | tar -x -C "$$tmp" && \
		npx --no-install buf build "$$tmp" --exclude-source-info -o protos/released/engine-v1.binpb
	@echo "protos/released/engine-v1.binpb is now the contract at $(REF); empty accepted-breaks.json's list"

# The wheel and sdist, by the build backend, into dist/ (pip install 'dist/vlmserve-*.whl[cpu]').
dist: install
	$(BIN)/python -m hatchling build -d dist

lint: install buf-lint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) node_modules .mypy_cache .ruff_cache .pytest_cache dist
