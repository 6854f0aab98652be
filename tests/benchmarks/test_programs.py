"""Every benchmark program starts as ``python -m benchmarks.<name>`` from the repository
root (its imports resolve, its options parse) and names itself that way; the ONNX
benchmark's shell script finds the repository from its own place."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def programs() -> list:
    """Module names of the programs under benchmarks/: each ``__main__.py`` (its package)
    and each other module with a ``__main__`` block."""
    found = []
    for path in sorted((REPO / "benchmarks").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        if path.name == "__main__.py":
            found.append(module.removesuffix(".__main__"))
        elif 'if __name__ == "__main__":' in path.read_text():
            found.append(module)
    return found


def test_every_experiment_folder_with_code_has_a_program():
    experiments = {p.parent.name for p in (REPO / "benchmarks").glob("*/__init__.py")}
    assert experiments == {p.split(".")[1] for p in programs() if p.count(".") >= 1}
    assert "benchmarks.head_loss" in programs() and "benchmarks.llm_rtf.profile" in programs()


# Runs each program as ``python -m <program> --help`` would (runpy as __main__, argv[0] its
# file), one after another in one fresh process: each would spend seconds importing torch.
HELP_DRIVER = """
import contextlib, importlib.util, io, json, runpy, sys
results = {}
for program in sys.argv[1:]:
    spec = importlib.util.find_spec(program)
    sys.argv = [spec.origin if spec.submodule_search_locations is None else
                spec.submodule_search_locations[0] + "/__main__.py", "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(program, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit:
        code = exit.code
    except Exception as error:  # this program's test fails, the others run
        code = f"{type(error).__name__}: {error}"
    results[program] = [code, out.getvalue()]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def helps() -> dict:
    """program -> (exit code, stdout) of ``--help``."""
    paths = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    completed = subprocess.run([sys.executable, "-c", HELP_DRIVER, *programs()], cwd=REPO, capture_output=True,
                               text=True, timeout=300, env=dict(os.environ, PYTHONPATH=os.pathsep.join(paths)))
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.splitlines()[-1])


@pytest.mark.parametrize("program", programs())
def test_program_help_runs_as_a_module(program, helps):
    code, stdout = helps[program]
    assert code == 0, stdout
    assert stdout.startswith(f"usage: python -m {program} ")
    assert "scripts/" not in stdout


def test_onnx_benchmark_resolves_the_repository_from_its_own_folder(tmp_path):
    completed = subprocess.run(["bash", str(REPO / "benchmarks/onnx/run_mini.sh"), "exp/absent"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 1
    assert f"no exp/absent/checkpoint-*.pt under {REPO}/egs/mini" in completed.stderr
