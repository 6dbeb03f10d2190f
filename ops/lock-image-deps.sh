#!/usr/bin/env bash
# Regenerate ops/image-constraints.txt: every Python package the image installs, resolved from pyproject.toml's
# pins FOR THE IMAGE'S PLATFORM (Linux x86_64, CPython 3.11, wheels only), whatever machine runs this. On that
# platform PyPI's torch is the CUDA build, so its nvidia-* runtime wheels and triton are resolved and pinned exactly
# as torch's metadata requires; a lock made for the build host (a CPU-only index, macOS) would miss them.
# Needs pip >= 23 and PyPI (or PIP_INDEX_URL); only metadata is fetched (PEP 658), no wheel is installed.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-${repo}/.venv/bin/python}"
platform="${LOCK_PLATFORM:-manylinux_2_28_x86_64}"
report="$(mktemp)"
trap 'rm -f "${report}"' EXIT
mapfile -t deps < <("${python}" - "${repo}/pyproject.toml" <<'PY'
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))
PY
)
"${python}" -m pip install --dry-run --ignore-installed --quiet --report "${report}" \
  --platform "${platform}" --python-version 3.11 --implementation cp --only-binary=:all: "${deps[@]}"
{
  echo "# Exact versions of every Python package in the image, resolved from pyproject.toml's pins for"
  echo "# ${platform} / CPython 3.11 (torch's CUDA build with its nvidia-* wheels and triton)."
  echo "# Regenerate: ops/lock-image-deps.sh"
  "${python}" - "${report}" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = sorted((i["metadata"]["name"].lower(), i["metadata"]["version"]) for i in doc["install"])
print("".join(f"{n}=={v}\n" for n, v in rows if n != "sc-app"), end="")
PY
} > "${repo}/ops/image-constraints.txt"
echo "wrote ops/image-constraints.txt"
