# The lab's commands. Everything installs itself into .venv on first use.
#   make book     run a session (GPU if present, CPU mode otherwise), generate the log, build the book
#   make test     unit tests, every chapter through papermill in CPU mode, kernel compile check, book build
#   make kernels  compile-check every kernel for sm_80 and sm_90a and print the resource table
#   make lab      open JupyterLab on the chapters with the venv's kernel
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Every cache goes under LAB_CACHE_DIR (lab/paths.py reads the same variable): point it elsewhere for a
# read-only or shared checkout.
LAB_CACHE_DIR ?= $(CURDIR)/.cache
export LAB_CACHE_DIR
export MPLCONFIGDIR := $(LAB_CACHE_DIR)/matplotlib
export JUPYTER_CONFIG_DIR := $(LAB_CACHE_DIR)/jupyter
export JUPYTER_DATA_DIR := $(LAB_CACHE_DIR)/jupyter-data
export TORCH_EXTENSIONS_DIR := $(LAB_CACHE_DIR)/torch_extensions
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
# The venv's tools first (its pinned ninja, which torch's load_inline runs, and jupyter-book), as if activated.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: book test kernels lab env clean-book

# torch rule: if `import torch` already works, the venv sees that torch (--system-site-packages) and
# nothing touches it; otherwise torch==2.13.0 is installed (this machine's CPU wheel is on disk; an
# open range would download gigabytes).
$(STAMP): requirements.txt
	@if $(PY) -c "import torch" >/dev/null 2>&1; then \
	    echo "torch found: $$($(PY) -c 'import torch; print(torch.__version__)'), using it"; \
	    test -x $(VPY) || $(PY) -m venv --system-site-packages $(VENV); \
	else \
	    test -x $(VPY) || $(PY) -m venv $(VENV); \
	    $(VPY) -c "import torch" >/dev/null 2>&1 || $(VPY) -m pip install -q torch==2.13.0; \
	fi
	$(VPY) -m pip install -q -r requirements.txt
	@touch $(STAMP)

# A failed chapter does not stop the book: the log and the book are built from what ran, the failed
# chapters are named at the end, and the target then exits with the session's status (1: a chapter failed).
book: $(STAMP)
	@status=0; $(VPY) -m lab session --no-log || status=$$?; \
	$(VPY) -m lab log && $(VENV)/bin/jupyter-book build . --keep-going || exit 1; \
	echo "book: $(CURDIR)/_build/html/index.html"; \
	$(VPY) -m lab log --summary; \
	exit $$status

# pytest-xdist: one worker per core (at most 4, the suite's heavy tests are few), tests of one module fixture
# kept together (xdist_group); the nvcc compile checks are shared through the kernel cache, where one worker
# compiles a key and the others wait for it. The ten slowest tests are listed at the end.
# Cost on 2 cores with a cold cache (2026-11-29, 43 kernel files; user+sys of pytest and every child it waited for,
# measured per test on a machine shared with other jobs, which inflates each figure by some percent): ~920
# CPU-seconds, ~460 of them the compile gate's nvcc runs (device code for each target, nvcc -cubin: sm_90a ~400,
# sm_80 ~100; fwd/v07 alone ~60, one job that the test order starts first), ~190 the chapters under papermill (each
# chapter twice: against an empty and against the committed outputs/), ~32 the binding's CPU check build, ~30 the
# two PTX comparisons (each builds its switched variant only; the default's PTX is the one the gate's run kept),
# ~27 the session tests, ~22 the ring's multi-process runs; the rest under 20 each. Two cores need no less than
# ~460 seconds of wall time for that. A CI job that keeps $(LAB_CACHE_DIR)/compile_check
# between runs (its keys hash each kernel's sources with their headers, the flags and nvcc's release) re-runs nvcc
# only for the kernels that changed.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --dist loadgroup --durations=10 tests

kernels:
	@if [ -x $(VPY) ]; then $(VPY) -m lab compile; else $(PY) -m lab compile; fi

env: $(STAMP)
	$(VPY) -m lab env

lab: $(STAMP)
	$(VPY) -m ipykernel install --sys-prefix --name python3 --display-name "lab (.venv)" >/dev/null
	$(VENV)/bin/jupyter lab chapters/ $(if $(filter 0,$(shell id -u)),--allow-root)

clean-book:
	rm -rf _build
