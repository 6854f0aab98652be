#!/usr/bin/env bash
# Creates the project's virtual environment (.venv) and installs the project into it.
# Quick to rerun: it does nothing once the environment matches pyproject.toml.
# A torch that is already importable in the environment is kept (a user's CUDA build);
# otherwise torch==2.13.0 is installed, which on a CPU-only machine with the local wheel
# resolves to the CPU build. Set VENV=... to use another location, PYTHON=... for the
# interpreter that creates it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${VENV:-$root/.venv}
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  echo "setup_env: creating $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  echo "setup_env: installing torch==2.13.0"
  "${pip[@]}" install 'torch==2.13.0'
fi

digest=$(cat "$root/pyproject.toml" "$root/requirements.txt" | sha1sum | cut -c1-12)
stamp="$venv/.installed-$digest"
if [ ! -f "$stamp" ]; then
  echo "setup_env: installing the project and its dependencies"
  # Pin the torch we have so no dependency can swap it for another build.
  torch_version=$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
  echo "torch==$torch_version" > "$venv/torch-constraint.txt"
  "${pip[@]}" install -c "$venv/torch-constraint.txt" -e "$root[dev]"
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
