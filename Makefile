PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest-xdist workers for `make test` (0: one process). Most tests wait on servers and
# jobs rather than use a core; tests/conftest.py keeps what a run has one of on one worker.
PYTEST_WORKERS ?= 2

.PHONY: demo test lint serve clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# a venv made before cubic took xgboost-cpu on Linux: both would own the same files
	$(BIN)/python -c "import importlib.metadata as m, sys; m.version('xgboost'); \
		sys.exit(sys.platform not in ('linux', 'win32'))" 2>/dev/null && \
		$(BIN)/pip uninstall -q -y xgboost xgboost-cpu nvidia-nccl-cu12 || true
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/cubic demo

test: $(STAMP)
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

serve: $(STAMP)
	$(BIN)/cubic serve

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
