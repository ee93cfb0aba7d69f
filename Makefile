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
# Every committed reference (the H100's first, then the H200's where it exists): the synthesis
# compares their GPUs.
REFERENCES ?= $(REFERENCE) $(patsubst %/limits.parquet,%,$(wildcard results/reference/h200/limits.parquet))
RUN_ID := $(shell date -u +%Y%m%dT%H%M%SZ)
# Where `make bench` writes (fresh runs live under results/runs/, ignored by git).
BENCH_OUT ?= results/runs/$(RUN_ID)
# What `make render` reads: one results folder, or several (the first is the chapters'; the
# synthesis compares the GPUs of all), e.g. RESULTS="results/reference/h100 results/reference/h200".
RESULTS ?= $(REFERENCES)
SPACE := $(subst ,, )
# The bench's grid: book (what the book shows, ~5 min on one H100), reference (what make reference
# runs), full (every size: a deep sweep the book does not need), smoke.
GRID ?= book
# make reference's folder: one per commit, so that the same command run again continues it.
REFERENCE_OUT ?= results/runs/reference-$(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# Seconds for make profile's two passes together (240 where not given; the cases after it:
# skipped rows, resumable). make reference has no budget of its own (a reference needs every
# case): what LIMIT leaves, and PROFILE_BUDGET only where given.
PROFILE_BUDGET ?=
# make reference: stop cleanly after LIMIT seconds, to be run again (a device call is cut at
# 600 s: LIMIT=572 leaves the last step's grace and the call's own setup their seconds); FORCE=1
# runs it on a changed tree (the result cannot be promoted).
LIMIT ?=
FORCE ?=
BENCH_ARGS ?=
# Processes that compile before the timed sweep (analysis/bench/warm.py; -1: 3/4 of the CPUs, at
# most 12; 0: none).
WARM ?= -1
# Test processes (pytest-xdist): the compiling is most of a test run's time, and parallel.
JOBS ?= auto
OUTPUT_DIR := _output
BOOK_PDF := kernel-fusion-in-triton.pdf

export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
HAS_GPU = $(RUN_PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null

.PHONY: help setup test test-all test-report bench reference profile seed002 render report gate smoke-data clean

help: ## list the targets
	@echo "Kernel fusion in Triton. Targets:"
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9-]+):.*## /  make \1\t/' | expand -t 20
	@echo "Variables: PYTHON=<interpreter> (reuse one, install nothing), RESULTS='<dir> ...' (render),"
	@echo "           GRID=book|reference|full|smoke, BENCH_OUT=<dir>, BENCH_ARGS='--family elementwise' (bench),"
	@echo "           REFERENCE_OUT=<dir>, LIMIT=<s>, FORCE=1 (reference), PROFILE_BUDGET=<s> (profile, reference),"
	@echo "           JOBS=<test processes, default auto>"

setup: $(SETUP_STAMP) ## make the virtual environment .venv with pinned dependencies (once)

# $(PY) may be a venv's own python (a lent GPU machine's is /opt/torch/.venv's), whose packages
# --system-site-packages does not reach: a .pth file puts its site-packages after the venv's own.
# On a GPU machine only, each alone (one that cannot be installed is said): transformers and what
# the peers import (`model`, `peer-imports`) held to the machine's torch, triton and numpy; then
# the peers without their declared dependencies (FlagGems pins numpy==1.26.4), last, as pip's
# check of installed pins, skipped by --no-deps, would print those pins as an ERROR
# (docs/benchmarking.md).
extra = $(shell sed -n '/^\[project.optional-dependencies\]/,/^\[/p' pyproject.toml | grep -E '^$(1) *=' | grep -oE '"[^"]+"' | tr -d '"')
PEERS := $(call extra,peers)
PEER_NEEDS := $(call extra,peer-imports) $(call extra,model)

$(VENV)/.installed: requirements.txt pyproject.toml
	@if $(PY) -c "import sys, torch, triton; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
	  echo "setup: $(PY) has a CUDA torch and triton: reusing them (venv with system site-packages)"; \
	  $(PY) -m venv --system-site-packages $(VENV) && \
	  $(PY) -c "import site; print('\n'.join(site.getsitepackages()))" \
	    > "$$($(VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_reused_python.pth" && \
	  grep -vE '^(torch|triton|numpy)==' requirements.txt > $(VENV)/requirements-gpu.txt && \
	  $(VENV)/bin/pip install -q -r $(VENV)/requirements-gpu.txt && \
	  $(VENV)/bin/python -c "import numpy, torch, triton; print(f'torch=={torch.__version__}\ntriton=={triton.__version__}\nnumpy=={numpy.__version__}')" > $(VENV)/constraints-gpu.txt && \
	  for req in $(PEER_NEEDS); do \
	    $(VENV)/bin/pip install -q -c $(VENV)/constraints-gpu.txt "$$req" \
	      || echo "setup: could not install $$req: the bench says which rows will lack it"; \
	  done; \
	  for req in $(PEERS); do \
	    $(VENV)/bin/pip install -q --no-deps "$$req" \
	      || echo "setup: could not install $$req: its rows will say unsupported (the bench and the book say so)"; \
	  done; \
	else \
	  echo "setup: CPU machine: torch (CPU build) and triton from requirements.txt"; \
	  $(PY) -m venv $(VENV) && $(VENV)/bin/pip install -q -r requirements.txt; \
	fi
	@touch $@

test: setup ## fast correctness tests: every op and kernel path on the fewest shapes (GPU if present, else the interpreter)
	$(RUN_PY) -m pytest -q -n $(JOBS) --maxprocesses 16 -m "not full" tests

test-all: setup ## every correctness test: the whole matrix of shapes, dtypes and options (what CI runs)
	$(RUN_PY) -m pytest -q -n $(JOBS) --maxprocesses 16 tests

bench: setup ## GPU: the sweeps of GRID (book, reference, full or smoke) and their tail steps into results/runs/<time>/
	@# Without a GPU the bench says so itself (and the check would cost a start of torch).
	@# With TAIL: then seed 002's own protocol (the attention chapter shows its CSV), launch
	@# costs, the GPT-2 check and the LM head's time-memory front, each in a process of its own;
	@# each prints its wall time.
	$(RUN_PY) -m triton_fusion_report.analysis.bench --out $(BENCH_OUT) --grid $(GRID) --warm $(WARM) $(if $(TAIL),--tail) $(BENCH_ARGS)
	@ln -sfn $(notdir $(BENCH_OUT)) $(dir $(BENCH_OUT))latest 2>/dev/null || true

# The steps after the sweep run with a whole grid (book, reference, full), not a part or the smoke
# grid.
TAIL = $(if $(BENCH_ARGS),,$(filter-out smoke,$(GRID)))

reference: setup ## GPU + Nsight Compute: at a clean commit, the reference grid, its tail steps and the profile into REFERENCE_OUT; run again to continue (LIMIT=<s>)
	@# Refuses a changed tree (FORCE=1 tries it anyway); each step skipped where the folder has it,
	@# so a call cut by a time limit is continued by the same command (docs/benchmarking.md).
	$(RUN_PY) -m triton_fusion_report.analysis.bench.reference --out $(REFERENCE_OUT) --warm $(WARM) $(if $(PROFILE_BUDGET),--profile-budget $(PROFILE_BUDGET)) $(if $(LIMIT),--limit $(LIMIT)) $(if $(FORCE),--force)

profile: setup ## GPU + Nsight Compute: the cases the book reads, DRAM bytes into BENCH_OUT/profile.parquet and the matmul kernels' details into profile_details.parquet, within PROFILE_BUDGET s
	@$(HAS_GPU) || { echo "make profile needs a CUDA GPU (and Nsight Compute, ncu)"; exit 1; }
	$(RUN_PY) -m triton_fusion_report.analysis.bench.profile --out $(BENCH_OUT) --both --resume --budget $(or $(PROFILE_BUDGET),240)

seed002: setup ## seed 002's softmax(X)@V benchmark to the letter (CSV + Parquet in BENCH_OUT)
	@$(HAS_GPU) || { echo "make seed002 needs a CUDA GPU"; exit 1; }
	$(RUN_PY) -m triton_fusion_report.analysis.bench.seed002 --out $(BENCH_OUT)

# Quarto: from the PATH, else the venv's, else `pip install quarto-cli` into the venv; sets q.
FIND_QUARTO = q=$$(command -v quarto || true); \
	if [ -z "$$q" ] && [ -x $(VENV)/bin/quarto ]; then q=$(VENV)/bin/quarto; fi; \
	if [ -z "$$q" ] && [ -x $(VENV)/bin/pip ]; then \
	  echo "quarto not found; trying 'pip install quarto-cli' into $(VENV)"; \
	  $(VENV)/bin/pip install -q quarto-cli 2>/dev/null && [ -x $(VENV)/bin/quarto ] && q=$(VENV)/bin/quarto; \
	fi
NO_QUARTO := Quarto (>= 1.4) is needed to render the report, and none was found or could be \
	installed: install it (https://quarto.org/docs/get-started/, or 'pip install quarto-cli' where \
	PyPI is reachable), put it on the PATH, and run this again.

render: setup ## render the book from RESULTS (default: the references; several folders: the across-families chapter compares their GPUs)
	@for r in $(RESULTS); do test -f $$r/limits.parquet || { echo "render: no results in $$r"; exit 1; }; done
	@$(FIND_QUARTO); \
	if [ -z "$$q" ]; then echo "render: $(NO_QUARTO)"; exit 1; fi; \
	echo "render: $$q, results from $(RESULTS)"; \
	rm -rf $(OUTPUT_DIR); \
	py=$$(case "$(RUN_PY)" in */*) echo "$(abspath $(RUN_PY))";; *) command -v $(RUN_PY);; esac); \
	FUSION_RESULTS=$(subst $(SPACE),:,$(strip $(abspath $(RESULTS)))) QUARTO_PYTHON=$$py "$$q" render && \
	echo "report: $(OUTPUT_DIR)/index.html and $(OUTPUT_DIR)/$(BOOK_PDF)"

test-report: setup ## render the book from RESULTS and test the output (links, cross-references, figures, PDF)
	@$(FIND_QUARTO); \
	if [ -z "$$q" ]; then \
	  if [ "$${CI:-}" = true ]; then echo "test-report: FAILED (CI=true): $(NO_QUARTO)"; exit 1; fi; \
	  echo "test-report: SKIPPED: $(NO_QUARTO)"; exit 0; \
	fi; \
	PATH=$$(dirname $$q):$$PATH $(MAKE) --no-print-directory render RESULTS="$(RESULTS)" && \
	RENDERED_OUTPUT=$(abspath $(OUTPUT_DIR)) $(RUN_PY) -m pytest -q tests/test_rendered.py

report: setup ## GPU: test, bench, render the fresh run. No GPU: render the committed reference
	@if $(HAS_GPU); then \
	  t0=$$(date +%s); \
	  $(MAKE) --no-print-directory test && t1=$$(date +%s) && \
	  $(MAKE) --no-print-directory bench BENCH_OUT=results/runs/$(RUN_ID) && t2=$$(date +%s) && \
	  $(MAKE) --no-print-directory render RESULTS=results/runs/$(RUN_ID) && t3=$$(date +%s) && \
	  echo "report: test $$((t1 - t0)) s, bench $$((t2 - t1)) s, render $$((t3 - t2)) s"; \
	else \
	  echo "report: no GPU here: rendering from the committed reference results $(REFERENCES)"; \
	  t0=$$(date +%s); \
	  $(MAKE) --no-print-directory render RESULTS="$(REFERENCES)" && \
	  echo "report: render $$(( $$(date +%s) - t0 )) s"; \
	fi

gate: setup ## GPU: what a change to kernels/ or tests/ passes before it is done: make test natively, then a smoke make report (tools/gate.sh)
	PYTHON=$(RUN_PY) bash tools/gate.sh $(if $(filter command line,$(origin BENCH_OUT)),$(BENCH_OUT))

smoke-data: setup ## regenerate tests/data/smoke: the smoke grid on the CPU (interpreter), for the report tests
	rm -rf tests/data/smoke
	TRITON_INTERPRET=1 $(RUN_PY) -m triton_fusion_report.analysis.bench --out tests/data/smoke --grid smoke --device cpu --no-progress

clean: ## remove the venv, rendered output and fresh runs (keeps the reference results)
	rm -rf $(VENV) $(OUTPUT_DIR) .quarto .book-cache report/data report/figures results/runs .pytest_cache
