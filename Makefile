# Two commands set everything up on a fresh machine: `make lab` and `make test`. `make help` lists the rest.
PYTHON     ?= python3
# CI sets TORCH_SPEC=torch==2.13.0 (the CPU wheel on local disk). On a laptop without a GPU, a CPU-only
# wheel spec saves gigabytes; on a GPU box the default pulls the CUDA build.
TORCH_SPEC ?= torch>=2.4
VENV       ?= .venv
PY         := $(VENV)/bin/python
PYTEST_ARGS ?=
# make test runs on JOBS pytest-xdist workers (4 on 2 cores: more workers than cores, as grading waits on kernels,
# sockets, deadline-bound mutants and torchrun much of the time); the tests that share a lab's
# grading (or a cheat corpus) stay on one worker, and the longest start first (tests/conftest.py, EXPECTED_S).
JOBS       ?= 4
# 1: install Lab 10's optional frameworks extra where the platform has wheels; 0: leave it out
FRAMEWORKS ?= 1
# 1: install Lab 11's optional kernels extra (Triton, numba, numba-cuda) where the platform has wheels; 0: leave it out
KERNELS    ?= 1
PARALLEL   := $(if $(filter-out 0 1,$(JOBS)),-n $(JOBS) --dist loadgroup,)
# make test-deploy on 2 workers: the tests that write the course's gradebook (hub, Slurm grading) on one, the others
# (train.sbatch, the layouts in their own copies) on the other (tests/deploy/conftest.py)
DEPLOY_JOBS ?= 2
DEPLOY_PARALLEL := $(if $(filter-out 0 1,$(DEPLOY_JOBS)),-n $(DEPLOY_JOBS) --dist loadgroup,)
# pip, run again from the start when it fails: a download that breaks off mid-file fails pip even after its own
# resumes (PyPI's 285 MB Triton wheel has, in CI), and a fresh request usually goes through. Wheels that came
# whole are in pip's cache, so a second try downloads only what did not; a real error fails PIP_TRIES times, fast.
PIP_TRIES  ?= 3
PIP        := retry() { n=1; until "$$@"; do if [ $$n -ge $(PIP_TRIES) ]; then echo "pip failed $$n times (see above)" >&2; return 1; fi; echo "pip failed (try $$n of $(PIP_TRIES)); trying again in 10 s" >&2; n=$$((n + 1)); sleep 10; done; }; retry $(PY) -m pip

.PHONY: help install bytecode lab test test-gpu test-fast test-deploy release bench bench-grade bench-validate doctor mutate stress stress-tests horovod clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml jupyter-config/jupyter_server_config.d/dtlabs-kernels.json
	$(PYTHON) -m venv $(VENV)
	@$(PIP) install -q --upgrade pip
	@$(PIP) install -q --no-compile "$(TORCH_SPEC)"
	@# The course with its test tools and, where the platform has wheels, the optional extras, in one resolve:
	@# Lab 10's frameworks (DeepSpeed, Ray, TensorFlow, Accelerate: Linux x86_64, Python < 3.14; FRAMEWORKS=0 skips)
	@# and Lab 11's kernels (Triton, numba, numba-cuda: Linux x86_64 or aarch64, Python < 3.15; KERNELS=0 skips).
	@# The constraint pins the torch installed above, so no extra can pull another (CUDA) build, and a CUDA torch
	@# keeps the triton it was built with.
	$(PY) -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > $(VENV)/torch-constraint.txt
	@extras=test,bench; \
	if [ "$(FRAMEWORKS)" != "0" ] && $(PY) -c "import platform, sys; sys.exit(not (platform.system() == 'Linux' and platform.machine() == 'x86_64' and sys.version_info < (3, 14)))"; then \
		extras=$$extras,frameworks; \
	else echo "Lab 10's frameworks not installed (FRAMEWORKS=$(FRAMEWORKS), or no wheels for this platform): its framework tests will say so"; fi; \
	if [ "$(KERNELS)" != "0" ] && $(PY) -c "import platform, sys; sys.exit(not (platform.system() == 'Linux' and platform.machine() in ('x86_64', 'aarch64') and sys.version_info < (3, 15)))"; then \
		extras=$$extras,kernels; \
	else echo "Lab 11's kernels not installed (KERNELS=$(KERNELS), or no Triton wheels for this platform): its kernel cells will say so"; fi; \
	echo "$(PY) -m pip install -q --no-compile -c $(VENV)/torch-constraint.txt -e \".[$$extras]\""; \
	$(PIP) install -q --no-compile -c $(VENV)/torch-constraint.txt -e ".[$$extras]"
	@# The server config that enables lab_utils/launcher/kernel_channels.py (JupyterLab's kernels on Unix sockets only
	@# their user can reach), where `pip install .` puts it: setuptools leaves data files out of an editable install.
	install -D -m 644 jupyter-config/jupyter_server_config.d/dtlabs-kernels.json \
		$(VENV)/etc/jupyter/jupyter_server_config.d/dtlabs-kernels.json
	@# Bytecode on every core at once (pip compiles on one), but not for the packages' own test suites (a sixth of
	@# the files; nothing here imports them). A file that does not compile is not an error here, as under pip:
	@# Python reads its source.
	$(PY) -m compileall -qq -j 0 -x '/tests?/' $(VENV)/lib || true
	touch $@

install: $(VENV)/.installed  ## create .venv and install the course package with its test tools

# JUPYTER_CONFIG_PATH puts the course's nbgrader config (grader/) in force in JupyterLab too: the toolbar's
# Validate button then uses its per-cell limit (180 s, not nbgrader's 30 s) and the formgrader finds the course.
lab: $(VENV)/.installed  ## create .venv, install, open JupyterLab on labs/
	JUPYTER_CONFIG_PATH="$(CURDIR)/grader$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
		$(VENV)/bin/jupyter lab --notebook-dir=labs

# lab_utils' bytecode once up front: hundreds of test processes import it, and where PYTHONDONTWRITEBYTECODE is set
# (as on our CI machines) each would otherwise compile it from source.
bytecode: $(VENV)/.installed
	$(PY) -m compileall -qq lab_utils

test: bytecode  ## create .venv, install, run every test (CPU; GPU tests skip without CUDA; JOBS=4 workers)
	$(PY) -m pytest $(PARALLEL) $(PYTEST_ARGS)

test-gpu: $(VENV)/.installed  ## the gpu-marked tests (NCCL, one rank per GPU); they skip with a reason without CUDA
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

test-fast: bytecode  ## the tests that start no notebook, kernel, torchrun job, grading run or browser
	$(PY) -m pytest -m "not slow and not browser" $(PARALLEL) $(PYTEST_ARGS)

# Real users, a single-node Slurm and a JupyterHub with nbgrader's exchange on this machine (root only; they skip with
# the reason elsewhere). .ci/install-deploy installs what they need; every daemon they start, they stop.
test-deploy: bytecode  ## Slurm grading array + train.sbatch, JupyterHub + nbgrader exchange in Chromium (root; installs)
	TORCH_SPEC="$(TORCH_SPEC)" bash .ci/install-deploy
	@# exit 5 (no test collected) is not a failure here; a skip prints its reason (-ra)
	@# and whatever happened to pytest, nothing the tests started keeps running (both scripts stop only their own)
	TORCH_SPEC="$(TORCH_SPEC)" $(PY) -m pytest tests/deploy -p no:cacheprovider $(DEPLOY_PARALLEL) $(PYTEST_ARGS); rc=$$?; \
		if [ "$$(id -u)" = 0 ]; then grader/hub/hub.sh down >/dev/null 2>&1; grader/slurm/local-cluster.sh down >/dev/null 2>&1; fi; \
		if [ $$rc = 5 ]; then echo "test-deploy: no deployment test was collected"; rc=0; fi; exit $$rc

release: $(VENV)/.installed  ## regenerate labs/ from solutions/ with nbgrader (commit the result)
	$(VENV)/bin/dtlabs release

doctor: $(VENV)/.installed  ## check torch, backends, GPUs and a 2-rank all-reduce
	$(VENV)/bin/dtlabs doctor

bench: $(VENV)/.installed  ## launcher benchmark: medians and ratios against mp.spawn and notebook_launcher
	$(PY) benchmarks/bench_launch.py

bench-grade: $(VENV)/.installed  ## time sandboxed `dtlabs grade` against nbgrader's own Execute, and --jobs 2 vs 1
	$(PY) benchmarks/bench_grading.py

bench-validate: $(VENV)/.installed  ## time `dtlabs validate` against `nbgrader validate` per lab (target ratio 0.5), and cold vs warm kernels
	$(PY) benchmarks/bench_validate.py

bench-class: $(VENV)/.installed  ## a class at once: N students in cgroups of their own (root); failures, memory, makespan
	$(PY) benchmarks/bench_class.py $(BENCH_CLASS_ARGS)

MUTATE_N ?= 6
mutate: $(VENV)/.installed  ## mutation testing of every lab's tests (fixed seed; MUTATE_N mutants per lab)
	@set -e; for lab in $$(ls solutions); do $(VENV)/bin/dtlabs mutate $$lab --n $(MUTATE_N) --seed 0; done

K    ?= 10
LABS ?=
stress: $(VENV)/.installed  ## grade every lab's solution K times (K=10) with the other cores busy; LABS=... picks labs
	$(VENV)/bin/dtlabs stress $(LABS) --k $(K)

STRESS_TESTS ?= tests/labkit/test_torchrun.py tests/launcher/test_reliability.py tests/labs/test_browser.py
stress-tests: $(VENV)/.installed  ## run the torchrun, launcher-reliability and browser tests K times in a row under load
	$(VENV)/bin/dtlabs stress --tests "$(STRESS_TESTS)" --k $(K)

# Horovod 0.28.1 does not build against torch >= 2.1: it gets an environment of its own, .venv-horovod (torch 2.0.1 on
# Python 3.11, gloo, no MPI), which Lab 10's Horovod cell uses where it exists. .ci/build-horovod says how.
horovod:  ## build Horovod 0.28.1 against torch 2.0.1 in .venv-horovod, for Lab 10's Horovod cell
	bash .ci/build-horovod

clean:  ## remove .venv and grader work folders
	rm -rf $(VENV) grader/work
