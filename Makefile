# Kernel fusion in Triton: a reproducible report.   `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The interpreter the virtual environment is made from.
PY ?= python3
VENV ?= .venv
# PYTHON=... runs everything with an interpreter that already has torch, triton, pandas, pyarrow,
# matplotlib and pytest (e.g. a GPU machine with no network): no venv is made, nothing installed.
ifdef PYTHON
RUN_PY := $(PYTHON)
SETUP_STAMP :=
else
RUN_PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.installed
endif

# Committed results measured on a real GPU: what the report shows on a machine without one.
REFERENCE ?= results/reference/h100
RUN_ID := $(shell date -u +%Y%m%dT%H%M%SZ)
# Where `make bench` writes (fresh runs live under results/runs/, ignored by git).
BENCH_OUT ?= results/runs/$(RUN_ID)
# What `make render` reads.
RESULTS ?= $(REFERENCE)
BENCH_ARGS ?=
OUTPUT_DIR := _output

export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
HAS_GPU = $(RUN_PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null

.PHONY: help setup test bench seed002 render report clean

help: ## list the targets
	@echo "Kernel fusion in Triton. Targets:"
	@grep -E '^[a-z0-9]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9]+):.*## /  make \1\t/' | expand -t 16
	@echo "Variables: PYTHON=<interpreter> (reuse one, install nothing), RESULTS=<dir> (render),"
	@echo "           BENCH_OUT=<dir>, BENCH_ARGS='--grid smoke --family elementwise' (bench)"

setup: $(SETUP_STAMP) ## make the virtual environment .venv with pinned dependencies (once)

$(VENV)/.installed: requirements.txt
	@if $(PY) -c "import sys, torch, triton; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
	  echo "setup: $(PY) has a CUDA torch and triton: reusing them (venv with system site-packages)"; \
	  $(PY) -m venv --system-site-packages $(VENV) && \
	  grep -vE '^(torch|triton|numpy)==' requirements.txt > $(VENV)/requirements-gpu.txt && \
	  $(VENV)/bin/pip install -q -r $(VENV)/requirements-gpu.txt; \
	else \
	  echo "setup: CPU machine: torch (CPU build) and triton from requirements.txt"; \
	  $(PY) -m venv $(VENV) && $(VENV)/bin/pip install -q -r requirements.txt; \
	fi
	@touch $@

test: setup ## correctness tests (GPU if present, else Triton's interpreter on the CPU)
	$(RUN_PY) -m pytest -q tests

bench: setup ## run the sweeps (with seed 002 and host timings) on the GPU into results/runs/<time>/
	@$(HAS_GPU) || { echo "make bench needs a CUDA GPU; without one, 'make report' renders the committed $(REFERENCE)"; exit 1; }
	$(RUN_PY) -m analysis --out $(BENCH_OUT) $(BENCH_ARGS)
	@# The full bench includes seed 002's own protocol (the attention chapter shows its CSV).
	@if [ -z "$(BENCH_ARGS)" ]; then $(RUN_PY) -m analysis.seed002 --out $(BENCH_OUT) && \
	  $(RUN_PY) -m analysis.host_overhead --out $(BENCH_OUT)/host_overhead.csv; fi
	@ln -sfn $(notdir $(BENCH_OUT)) $(dir $(BENCH_OUT))latest 2>/dev/null || true

seed002: setup ## seed 002's softmax(X)@V benchmark to the letter (CSV + Parquet in BENCH_OUT)
	@$(HAS_GPU) || { echo "make seed002 needs a CUDA GPU"; exit 1; }
	$(RUN_PY) -m analysis.seed002 --out $(BENCH_OUT)

render: setup ## render the report (HTML + PDF in _output/) from RESULTS (default: the reference)
	@test -f $(RESULTS)/limits.parquet || { echo "render: no results in $(RESULTS)"; exit 1; }
	@q=$$(command -v quarto || true); \
	if [ -z "$$q" ] && [ -x $(VENV)/bin/quarto ]; then q=$(VENV)/bin/quarto; fi; \
	if [ -z "$$q" ] && [ -x $(VENV)/bin/pip ]; then \
	  echo "render: quarto not found; trying 'pip install quarto-cli' into $(VENV)"; \
	  $(VENV)/bin/pip install -q quarto-cli && [ -x $(VENV)/bin/quarto ] && q=$(VENV)/bin/quarto; \
	fi; \
	if [ -z "$$q" ]; then \
	  echo "render: Quarto (>= 1.4) is needed to render the report and could not be installed."; \
	  echo "        Install it from https://quarto.org/docs/get-started/ (or 'pip install quarto-cli'"; \
	  echo "        where PyPI is reachable), then run 'make render' again."; exit 1; \
	fi; \
	echo "render: $$q, results from $(RESULTS)"; \
	rm -rf $(OUTPUT_DIR); \
	FUSION_RESULTS=$(abspath $(RESULTS)) QUARTO_PYTHON=$$(command -v $(RUN_PY) || echo $(abspath $(RUN_PY))) \
	  "$$q" render && echo "report: $(OUTPUT_DIR)/index.html and $(OUTPUT_DIR)/*.pdf"

report: setup ## GPU: test, bench, render the fresh run. No GPU: render the committed reference
	@if $(HAS_GPU); then \
	  $(MAKE) --no-print-directory test && \
	  $(MAKE) --no-print-directory bench BENCH_OUT=results/runs/$(RUN_ID) && \
	  $(MAKE) --no-print-directory render RESULTS=results/runs/$(RUN_ID); \
	else \
	  echo "report: no GPU here: rendering from the committed reference results $(REFERENCE)"; \
	  $(MAKE) --no-print-directory render RESULTS=$(REFERENCE); \
	fi

clean: ## remove the venv, rendered output and fresh runs (keeps the reference results)
	rm -rf $(VENV) $(OUTPUT_DIR) .quarto results/runs .pytest_cache
