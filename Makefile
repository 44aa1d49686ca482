# Every target uses the project's virtualenv (.venv), created by `make install`.
PY ?= .venv/bin/python
VENV_BIN = .venv/bin

.PHONY: install lint format check typecheck imports test test-all ci demo bench release-check clean

install: .venv/.installed  ## create .venv and install polyloop with every extra, pinned dev tools included

.venv/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install --quiet -e ".[dev,gateway,testing,ray,otel,postgres,mcp]"
	touch .venv/.installed

format:  ## rewrite files with ruff's formatter and apply safe lint fixes
	$(VENV_BIN)/ruff format src tests tools
	$(VENV_BIN)/ruff check --fix src tests tools

lint:  ## ruff format check + ruff lint (includes the no-swallowed-exception rules)
	$(VENV_BIN)/ruff format --check src tests tools
	$(VENV_BIN)/ruff check src tests tools

imports:  ## the layering law (import-linter contracts in pyproject.toml)
	$(VENV_BIN)/lint-imports

typecheck:  ## mypy --strict on src
	$(VENV_BIN)/mypy --strict src

check: lint imports typecheck  ## everything static; must be clean before a commit lands

test: install  ## the README's test command
	$(PY) -m pytest -q

demo: install  ## the main job: install, then run the offline demo on the embedded defaults
	$(PY) -m tools.demo

bench:  ## the benchmarks (tiny sizes: BENCH_ARGS=--quick)
	$(PY) -m tools.bench.run_all $(BENCH_ARGS)

release-check:  ## build sdist+wheel, twine check, install the wheel in a fresh venv and use it
	bash tools/release_check.sh

ci: check test release-check

clean:
	rm -rf build dist .mypy_cache .pytest_cache .ruff_cache src/*.egg-info
