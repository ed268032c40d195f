# The lab's commands. Everything installs itself into .venv on first use.
#   make book     run a session (GPU if present, its kernels built in parallel first; CPU mode otherwise),
#                 generate the log, build the book
#   make test     unit tests, every chapter through papermill in CPU mode, kernel compile check, book build
#   make kernels  compile-check every kernel for sm_80 and sm_90a; print the resource table and what each file cost nvcc
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
	@status=0; $(VPY) -m lab session --no-log --prebuild || status=$$?; \
	$(VPY) -m lab log && $(VENV)/bin/jupyter-book build . --keep-going || exit 1; \
	echo "book: $(CURDIR)/_build/html/index.html"; \
	$(VPY) -m lab log --summary; \
	exit $$status

# pytest-xdist: one worker per core (at most 4, the suite's heavy tests are few), tests of one module fixture
# kept together (xdist_group); the nvcc compile checks are shared through the kernel cache, where one worker
# compiles a key and the others wait for it. The ten slowest tests are listed at the end.
# Cost on 2 cores with a cold cache, measured 2026-11-29 on a machine shared with another job (load ~2.5, which
# inflates each figure by some percent and makes two runs of one tree differ by up to ~10 %): per test, user+sys of
# the worker and of every child it waited for (taken at each test's start and end); the whole run, /usr/bin/time of
# make test: 826-876 CPU-seconds and 469-492 s of pytest wall time (406-451 s on quieter runs).
# - The compile gate, 44 kernel files: 400-448 of nvcc (the gate alone, cold LAB_CACHE_DIR: 410; 2026-11-30, each
#   nvcc run's own CPU as `python -m lab compile --cost` prints it: 407, sm_90a 322 and sm_80 85; nvcc --time on a
#   quiet machine: cicc 199, ptxas 180, the preprocessor 13), sm_90a 356 and sm_80 99; fwd/v07 54-67 (sm_90a: cicc 31 + ptxas 37, one job that the test order starts first),
#   fwd/v11 41-47, the rest under 25 a file. That is one nvcc -cubin per file and target, the least there is: nvcc
#   given both -gencode runs the preprocessor and cicc once per virtual arch (__CUDA_ARCH__ differs) and adds a
#   host pass, so the targets share no front end; -lineinfo costs ptxas nothing measurable. Nothing compiles a
#   key twice: the chapters' and the decode head-dim test's compile checks are the gate's keys, served from its
#   cache (the read-only-checkout test and test_add_version compile v01-sized files into caches of their own).
#   Each gate test runs its two targets at once, so the two workers keep four nvcc runs on the two cores; capping
#   them at one run a worker measured no better (the gate alone: 239 s and 448 CPU-seconds against 208 s and 410).
# - The two PTX comparisons: 31-36, one cicc run each for the switched variant (v11's paged switches 22-26, v08's
#   tanh 9-10); the default's PTX is the one the gate's run kept.
# - The chapters under papermill, each twice (against an empty and the committed outputs/): ~134 for the 32 runs
#   before the cache below (their kernels are forked warm from a server that has imported torch and numpy,
#   tests/book/warm_kernel.py, so the per-test figures above do not hold them). lab.record.load keeps a clean
#   records file's lines that hold a load's first plain string (the chapter's name), so a chapter's later cells
#   neither gunzip nor scan the committed records again: the 14 chapters' recorded() calls, replayed against the
#   committed outputs/, 24.8 -> 18.7; what is left is mostly each chapter's first load, which parses every row once
#   (~1.3) to find torn lines.
# - The binding's CPU check build: 23-28 of g++ (-O0: main.cpp 22 s, torch/extension.h alone 16.6; torch/python.h
#   with autograd's custom_function.h in its place 12.3, a change to the product's source for ~4: not taken).
# - The book's browser tests: 9 chromium runs; each waited ~5 s on the resolver for MathJax's CDN on a machine
#   without a network until chromium was given no host names (the same DOM): 25 -> 7-15 s of one worker's time.
# - 26-35 the session tests, 21-28 the ring's multi-process runs (torchrun: each rank imports torch), 15-17 the
#   build-concurrency tests, ~18 test_add_version (a clone, its own cold cache and two pytest runs), 12-13 the
#   tools' driver builds, 60-75 the tests' own CPU in the workers; each worker's start ~8 (torch, collection, the
#   assertion rewrite of a fresh clone); the nbmake plugin, which no test uses, is not loaded (~2 s of the start).
# Two cores need no less than ~415-440 seconds of wall time for that, 200-224 of them the gate: a 300-second run
# would leave everything but the gate ~150 CPU-seconds of the ~400 it takes. A third worker only adds its start and
# collection (2026-11-30, one fresh clone: TEST_WORKERS=3 517 s and 966 CPU-seconds against 464 s and ~850 with 2). A CI job that keeps
# $(LAB_CACHE_DIR)/compile_check between runs (its keys hash each kernel's sources with their headers, the flags
# and nvcc's release) re-runs nvcc only for the kernels that changed.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --dist loadgroup -p no:nbmake --durations=10 tests

kernels:
	@if [ -x $(VPY) ]; then $(VPY) -m lab compile --cost; else $(PY) -m lab compile --cost; fi

env: $(STAMP)
	$(VPY) -m lab env

lab: $(STAMP)
	$(VPY) -m ipykernel install --sys-prefix --name python3 --display-name "lab (.venv)" >/dev/null
	$(VENV)/bin/jupyter lab chapters/ $(if $(filter 0,$(shell id -u)),--allow-root)

clean-book:
	rm -rf _build
