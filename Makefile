# shardflow: `make install` sets up .venv, `make test` runs the tests, `make run` runs the pipeline
# (plan, then train; Prefect and MLflow on embedded defaults) on the bundled example.
# GPU users: see README ("GPU install").
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.shardflow-installed

.PHONY: install test run bench clean

install: $(STAMP)

# Re-installs only when a requirements file or pyproject.toml changes.
$(STAMP): requirements/cpu.txt requirements/common.txt requirements/torchrec.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements/cpu.txt
	$(BIN)/pip install -q --no-deps -r requirements/torchrec.txt
	# compat mode: a plain path entry; the default editable finder adds ~20 ms to every start.
	$(BIN)/pip install -q --no-deps --no-build-isolation --config-settings editable_mode=compat -e .
	$(BIN)/python -c "import torchrec, prefect, ray, mlflow, pyarrow"
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest

run: install
	$(BIN)/shardflow run examples/specs/cpu_demo.yaml --topology examples/topologies/cpu_2proc.yaml --train-iterations 20 --batch-size 64

bench: install
	$(BIN)/python bench/plan_bench.py

clean:
	rm -rf $(VENV) out mlruns mlflow.db .shardflow
