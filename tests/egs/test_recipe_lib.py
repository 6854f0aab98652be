"""egs/shared/recipe_lib.sh: option parsing and stage selection shared by every run.sh."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _bash(script: str, *args: str) -> subprocess.CompletedProcess:
    preamble = f'set -euo pipefail; source "{REPO}/egs/shared/recipe_lib.sh"; stage=0; stop_stage=5; nj=4; parts="a b"\n'
    return subprocess.run(
        ["bash", "-c", preamble + script, "test", *args], capture_output=True, text=True, timeout=60
    )


def test_options_set_their_variables_in_both_spellings():
    result = _bash('parse_options stage stop_stage nj parts -- "$@"; echo "$stage|$stop_stage|$nj|$parts"',
                   "--stage", "2", "--stop-stage=3", "--parts", "x y z")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2|3|4|x y z"


def test_unknown_option_is_an_error_listing_the_known_ones():
    result = _bash('parse_options stage stop_stage -- "$@"', "--stages", "2")
    assert result.returncode != 0
    assert "unknown option --stages; known: --stage --stop-stage" in result.stderr


def test_option_without_value_and_stray_argument_are_errors():
    assert "option --stage needs a value" in _bash('parse_options stage -- "$@"', "--stage").stderr
    assert "unexpected argument 'oops'" in _bash('parse_options stage -- "$@"', "oops").stderr


def test_help_lists_options_with_current_values():
    result = _bash('parse_options stage nj parts -- "$@"', "--help")
    assert result.returncode == 0
    assert "--stage '0'" in result.stdout and "--nj '4'" in result.stdout and "--parts 'a b'" in result.stdout


def test_run_stage_selects_the_range_and_logs_it():
    script = 'stage=2; stop_stage=3; for k in 1 2 3 4; do if run_stage $k "step $k"; then echo ran $k; fi; done'
    result = _bash(script)
    assert [line for line in result.stdout.splitlines() if line.startswith("ran")] == ["ran 2", "ran 3"]
    assert "Stage 2: step 2" in result.stdout and "Stage 4" not in result.stdout


def test_done_already_reports_existing_outputs(tmp_path):
    marker = tmp_path / "done.txt"
    marker.write_text("")
    result = _bash(f'done_already "{marker}" "thing" && echo yes; done_already "{tmp_path}/none" "x" || echo no')
    assert f"thing: {marker} exists, skipping" in result.stdout
    assert result.stdout.splitlines()[-2:] == ["yes", "no"]
