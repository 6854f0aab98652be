# The two commands of the README's quick start. Each sets up .venv by itself.
PYTHON_VENV := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup mini test demo

setup:
	@bash scripts/setup_env.sh

# The main job: the loss demo (until egs/mini lands, then the mini recipe).
mini: setup
	$(PYTHON_VENV) scripts/pruned_ctc_demo.py

# The test suite (CUDA tests skip without a GPU; long runs need -m slow).
test: setup
	$(PYTHON_VENV) -m pytest -q -m "not slow" $(PYTEST_ARGS)
