# The two commands of the README's quick start. Each sets up .venv by itself.
PYTHON_VENV := .venv/bin/python
PYTEST_ARGS ?=
# pytest-xdist workers of make test / test-e2e, one test file per worker at a time: one per
# core, at most 4 (each loads torch; on 2 cores the suite takes half the time of one process).
# TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ "$$n" -gt 4 ] && n=4; echo $$n)
XDIST_ARGS = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: setup mini test test-e2e test-cuda demo

setup:
	@bash scripts/setup_env.sh

# The main job: the egs/mini recipe, from synthesized audio to WER (11-15 minutes on
# 2 idle cores). MINI_ARGS passes options, e.g. MINI_ARGS="--quick 1".
MINI_ARGS ?=
mini: setup
	cd egs/mini && PATH="$(CURDIR)/.venv/bin:$$PATH" ./run.sh $(MINI_ARGS)

# A one-minute example of the loss alone: Pruned CTC against the dense baseline.
demo: setup
	$(PYTHON_VENV) examples/pruned_ctc_demo.py

# The test suite (CUDA tests skip without a GPU; long runs need -m slow).
test: setup
	$(PYTHON_VENV) -m pytest -q -m "not slow and not e2e" $(XDIST_ARGS) $(PYTEST_ARGS)

# End-to-end recipe runs of a few minutes (the egs/mini quick run); .ci/run runs them too.
test-e2e: setup
	$(PYTHON_VENV) -m pytest -q -m "e2e and not slow" $(XDIST_ARGS) $(PYTEST_ARGS)

# The CUDA tests alone, in one process on the first GPU (they skip without one).
test-cuda: setup
	$(PYTHON_VENV) -m pytest -q -rs -m cuda -p no:xdist $(PYTEST_ARGS)
