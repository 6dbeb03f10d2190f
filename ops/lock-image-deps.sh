#!/usr/bin/env bash
# Regenerate ops/image-constraints.txt: every Python package the image installs, resolved from pyproject's pins.
# Local version labels (torch 2.13.0+cpu on a CPU-only index) are dropped so the lock fits the CUDA build too.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-${repo}/.venv/bin/python}"
report="$(mktemp)"
trap 'rm -f "${report}"' EXIT
"${python}" -m pip install --dry-run --ignore-installed --quiet --report "${report}" "${repo}"
{
  echo "# Exact versions of every Python package in the image (resolved from pyproject.toml's pins)."
  echo "# Regenerate: ops/lock-image-deps.sh   (torch: the image takes the PyPI build, CUDA on x86_64)."
  "${python}" - "${report}" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = sorted((i["metadata"]["name"].lower(), i["metadata"]["version"].split("+")[0]) for i in doc["install"])
print("".join(f"{n}=={v}\n" for n, v in rows if n != "sc-app"), end="")
PY
} > "${repo}/ops/image-constraints.txt"
echo "wrote ops/image-constraints.txt"
