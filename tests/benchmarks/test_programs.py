"""Every benchmark program starts as ``python -m benchmarks.<name>`` from the repository
root (its imports resolve, its options parse) and names itself that way; the ONNX
benchmark's shell script finds the repository from its own place."""

import subprocess
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


@pytest.mark.parametrize("program", programs())
def test_program_help_runs_as_a_module(program, run_program):
    completed = run_program(program, "--help", timeout=120)
    assert completed.stdout.startswith(f"usage: python -m {program} ")
    assert "scripts/" not in completed.stdout


def test_onnx_benchmark_resolves_the_repository_from_its_own_folder(tmp_path):
    completed = subprocess.run(["bash", str(REPO / "benchmarks/onnx/run_mini.sh"), "exp/absent"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 1
    assert f"no exp/absent/checkpoint-*.pt under {REPO}/egs/mini" in completed.stderr
