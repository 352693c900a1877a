# The two commands the README starts with are `make demo` and `make test`.
PY := .venv/bin/python

.PHONY: venv demo test lint unit integration bench clean

venv: .venv/.installed
.venv/.installed: pyproject.toml scripts/setup-venv.sh
	bash scripts/setup-venv.sh
	touch $@

demo: venv
	$(PY) examples/digits/demo.py

lint: venv
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/lint-imports

unit: venv
	$(PY) -m pytest tests/unit -q

integration: venv
	$(PY) -m pytest tests/integration -q

test: lint
	$(PY) -m pytest -q

bench: venv
	$(PY) bench/recovery.py

clean:
	rm -rf .venv .mypy_cache .ruff_cache .pytest_cache .hypothesis
