# shardflow: `make install` sets up .venv from the lock file, `make test` runs the tests (`make
# test-fast` without those that start torchrun, Prefect servers or Ray clusters), `make lint`
# runs ruff and mypy, `make run` runs the pipeline (plan, then train; Prefect and MLflow on embedded
# defaults) on the bundled example. `make lock` re-resolves requirements/cpu.txt into the lock
# (`make lock LOCK_FLAGS=--upgrade` to move every pin to the newest allowed version).
# GPU users: see README ("GPUs") and docs/gpu.md; `make gpu-check` checks the cuda path on the GPUs of this
# machine from a plain checkout, with the machine's own python3 (docs/gpu.md).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
UV := $(BIN)/uv
STAMP := $(VENV)/.shardflow-installed
LOCK := requirements/cpu.lock
# uv does not read pip's configuration: the CPU torch wheel (torch-2.13.0+cpu) is looked up here.
# Where it is not, e.g. `UV_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make install`.
FIND_LINKS ?= /opt/wheels
UV_FIND_LINKS := $(addprefix --find-links ,$(wildcard $(FIND_LINKS)))
LOCK_FLAGS ?=

.PHONY: install lock lint test test-fast run bench docs clean gpu-check

install: $(STAMP)

# The uv pinned in the lock, bootstrapped with pip; `uv pip sync` keeps it at the lock's version.
$(UV):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install -q "$$(grep -m1 '^uv==' $(LOCK) || echo uv)"

# Re-installs only when the lock or pyproject.toml changes. `uv pip sync` installs exactly the lock
# (removing anything else) and resolves no dependencies, so torchrec comes in as --no-deps.
# The editable install uses compat mode: a plain path entry; the default finder adds ~20 ms to every start.
# Bytecode is compiled here, once: where PYTHONDONTWRITEBYTECODE is set (as on this project's machines), every process
# would otherwise recompile torch and torchrec from source (import torchrec: ~9 s instead of ~4 s).
$(STAMP): $(LOCK) pyproject.toml | $(UV)
	@echo "installing .venv from $(LOCK) (only when the lock changed)"
	@$(UV) pip sync -q --compile-bytecode --python $(BIN)/python $(UV_FIND_LINKS) $(LOCK)
	@$(UV) pip install -q --python $(BIN)/python --no-deps --no-build-isolation -C editable_mode=compat -e .
	@$(BIN)/python -c "import torchrec, prefect, ray, mlflow, pyarrow, highspy"
	@touch $(STAMP)

# The CPU lock, and common.lock: its versions for what the GPU set shares (requirements/gpu.txt).
lock: | $(UV)
	$(UV) pip compile -q --python $(BIN)/python $(UV_FIND_LINKS) --custom-compile-command "make lock" \
		$(LOCK_FLAGS) --override requirements/overrides.txt requirements/cpu.txt -o $(LOCK)
	$(UV) pip compile -q --python $(BIN)/python $(UV_FIND_LINKS) --custom-compile-command "make lock" \
		--no-emit-package torch --no-annotate -c $(LOCK) requirements/common.txt requirements/dev.txt -o requirements/common.lock

# Both tools run, whichever finds something.
lint: install
	status=0; $(BIN)/ruff check . || status=1; $(BIN)/mypy || status=1; exit $$status

# Lint first: a static finding fails CI before minutes of tests. On every core (pytest-xdist), a
# test file per worker: a file's fixtures (a trained checkpoint, a Prefect server) are made once.
# One worker more than cores: a worker often waits (a server starting, ranks meeting), and with one
# per core 2 cores stood idle for 190 of their 990 s; with one more, for 8 (bench/RESULTS.md §12).
# The project's own bytecode first: where PYTHONDONTWRITEBYTECODE is set, each of the suite's few
# hundred processes would otherwise compile the modules it imports (~0.2 s for a rank's 105).
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
PYTEST_PARALLEL ?= -n $(PYTEST_WORKERS) --dist loadfile
COMPILE_OWN := $(BIN)/python -m compileall -q rec tasks flows bench examples
test: install lint
	@$(COMPILE_OWN)
	$(BIN)/python -m pytest $(PYTEST_PARALLEL)

# The tests marked slow start multi-process jobs (torchrun trainings, Prefect servers, Ray clusters).
test-fast: install lint
	@$(COMPILE_OWN)
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not slow"

run: install
	$(BIN)/shardflow run examples/specs/cpu_demo.yaml --topology examples/topologies/cpu_2proc.yaml

# Every visible GPU a rank; nothing installed (PYTHONPATH only), Prefect/Ray/MLflow not needed.
# GPU_PYTHON: the python with torch, torchrec and fbgemm-gpu (`make gpu-check GPU_PYTHON=.venv/bin/python`);
# one without them is named in one line, exit 2.
GPU_PYTHON ?= python3
GPU_CHECK_OUT ?= out/gpu_check
GPU_CHECK_FLAGS ?=
gpu-check:
	@command -v $(GPU_PYTHON) >/dev/null || { echo "gpu_check: no $(GPU_PYTHON) on this machine: choose the python with torch, torchrec and fbgemm-gpu, e.g. make gpu-check GPU_PYTHON=/path/to/venv/bin/python (docs/gpu.md)" >&2; exit 2; }
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) -m bench.gpu_check --out $(GPU_CHECK_OUT) $(GPU_CHECK_FLAGS)

# docs/cli.md is generated from the parser (tests/test_docs.py checks it is up to date).
docs: install
	$(BIN)/python -m flows.cli_reference > docs/cli.md

bench: install
	$(BIN)/python bench/plan_bench.py

clean:
	rm -rf $(VENV) out mlruns mlflow.db mlflow.db.lock .shardflow
