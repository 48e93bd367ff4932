# Entry points named in README.md. `make plan` and `make test` work from a fresh clone on Debian with Python 3.11+.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: plan test lint venv schema bench clean

plan: venv
	$(BIN)/gpushare plan --env dev

test: venv lint
	$(BIN)/pytest

lint: venv
	$(BIN)/ruff check gpushare infra tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/yamllint -s environments profiles

venv: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml
	@python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Python 3.11 or newer is needed"; exit 1; }
	@python3 -c 'import ensurepip, venv' 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv; }
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

schema: venv
	$(BIN)/gpushare schema --out schema

bench: venv
	$(BIN)/python benchmarks/foundation.py

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
