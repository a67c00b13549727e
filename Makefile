# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TINY   := models/tiny

.PHONY: install demo ablation test lint services clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

$(TINY)/config.json: | $(STAMP)
	$(VENV)/bin/cascade model init --out $(TINY)

# The main job: the whole cascade on the tiny model in one process (resumes if interrupted).
demo: install $(TINY)/config.json
	$(VENV)/bin/cascade run examples/tiny-cascade.yaml --resume

# The same cascade with and without distillation, same seed (the README's two tables).
ablation: install $(TINY)/config.json
	$(VENV)/bin/cascade run examples/tiny-cascade.yaml --resume
	$(VENV)/bin/cascade run examples/tiny-cascade.yaml --resume --no-distill

services:
	bash scripts/ensure-services.sh

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy cascade

test: install services $(TINY)/config.json
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy cascade
	$(VENV)/bin/pytest -q -p no:cacheprovider

clean:
	rm -rf runs test-artifacts
