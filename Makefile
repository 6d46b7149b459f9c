# nvtx-phases: `make demo` analyzes the bundled sample traces, `make test` runs lint and tests.
# Both create the virtual environment from scratch when it is missing (venv + pip install -e .[dev]).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
OUT ?= out

.PHONY: venv demo test lint format figures samples clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## demo: analyze traces_sample/ (synthetic GRPO run + a real nsys 2022.4 CPU capture), print tables, write figures
demo: $(STAMP)
	$(BIN)/nvtx-phases analyze traces_sample/grpo_synthetic.sqlite --out $(OUT)/demo --max-rows 40
	$(BIN)/nvtx-phases analyze traces_sample/grpo_synthetic_split --out $(OUT)/demo_split --quiet
	$(BIN)/nvtx-phases analyze traces_sample/cpu_rl_step_nsys2022.4.sqlite --out $(OUT)/demo_cpu --max-rows 16
	@echo "figures: $(OUT)/demo/figures/"

## test: lint, format check and the test suite
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## samples: regenerate the synthetic sample traces (deterministic)
samples: $(STAMP)
	$(BIN)/nvtx-phases synth traces_sample/grpo_synthetic.sqlite
	$(BIN)/nvtx-phases synth traces_sample/grpo_synthetic_split --split

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .ruff_cache
