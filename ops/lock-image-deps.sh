#!/usr/bin/env bash
# Regenerate ops/image-constraints.txt: every Python package the image installs, resolved from pyproject.toml's
# pins FOR THE IMAGE'S PLATFORM (Linux x86_64, CPython 3.11, wheels only), whatever machine runs this. On that
# platform PyPI's torch is the CUDA build: its Requires-Dist pins cuda-toolkit[...], nvidia-cudnn/nccl/cusparselt/
# nvshmem and triton exactly, and those pull in the nvidia-* runtime wheels (nvidia-cublas, -cuda-runtime, ...) and
# cuda-bindings/cuda-pathfinder; all of them land in the lock at the versions that metadata requires. The core
# metadata of each is vendored into tests/k8s/fixtures/wheel-metadata/ so the default test suite checks the lock
# against it offline: the wheel's PEP 658 `.metadata` file where the index serves one (torch, cuda-toolkit,
# triton, most nvidia-*), else the copy in pip's report, which pip read from the wheel itself (as of this lock:
# cuda-bindings, cuda-pathfinder, nvidia-nvjitlink; SOURCES.txt marks them).
#
# vLLM: the `vllm-cuda` extra (the CUDA `vllm` the image installs when its torch is the CUDA build, ops/image_vllm.py)
# is resolved together with the main dependencies, so vllm's own dependencies are pinned here too and cannot move
# torch or transformers. LOCK_PIN_EXISTING=1 (default) passes the current lock as constraints, so a regeneration adds
# what is new without moving what is locked (LOCK_UNPIN="a b" frees those names); 0 re-resolves everything at the
# newest versions pyproject allows. vllm 0.32 caps numpy < 2.4 (mistral-common): this lock was made with
# LOCK_UNPIN=numpy LOCK_ALLOW_DOWNGRADE=1, which moved numpy 2.4.6 -> 2.3.x and nothing else.
# boto3 (checkpoint.remote) came with botocore, which caps python-dateutil < 3: added with
# LOCK_UNPIN=python-dateutil LOCK_ALLOW_DOWNGRADE=1 (4.0.0 -> 2.9.0.post0, tzdata no longer needed).
#
# Resolution ignores this host's pip configuration (--isolated): a local CPU-only index or find-links dir would
# hand pip a torch+cpu wheel and no CUDA wheels at all. Index: LOCK_INDEX_URL (default PyPI); needs pip >= 23;
# only metadata is fetched (PEP 658), no wheel is installed.
#
# Two pip details this works around:
# * `--platform manylinux_2_28_x86_64` is taken literally (pip expands only the legacy manylinux2014/2010 tags), so
#   the nvidia wheels tagged manylinux_2_27/_2_17/... would be invisible and `nvidia-cudnn-cu13==9.20.0.48` would
#   fail ("from versions: 0.0.0a0"). Every glibc level up to LOCK_PLATFORM's is passed.
# * `--only-binary=:all:` (required with --platform) hides sdist-only packages: pip silently backtracks to an old
#   release with a wheel (antlr4-python3-runtime 4.9.3 is sdist-only -> hydra-core 0.11). LOCK_SDIST_ONLY lists
#   such pure-Python packages; they are built into wheels first, and lock_report.py refuses any downgrade.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-${repo}/.venv/bin/python}"
# The base image (python:3.11-slim-bookworm) has glibc 2.36: wheels tagged up to manylinux_2_36 run on it. vLLM
# 0.32 needs llguidance 1.7, whose x86_64 wheels are manylinux_2_31 only (a 2_28 platform found no llguidance).
platform="${LOCK_PLATFORM:-manylinux_2_36_x86_64}"
index="${LOCK_INDEX_URL:-https://pypi.org/simple}"
pin_existing="${LOCK_PIN_EXISTING:-1}"
read -r -a unpin <<< "${LOCK_UNPIN-}"  # names left out of those pins, e.g. "numpy" when a new dependency caps it
read -r -a sdist_only <<< "${LOCK_SDIST_ONLY-antlr4-python3-runtime==4.9.3}"  # "" = none
[[ "${platform}" =~ ^manylinux_2_([0-9]+)_([a-z0-9_]+)$ ]] \
  || { echo "LOCK_PLATFORM must look like manylinux_2_28_x86_64, got '${platform}'" >&2; exit 2; }
glibc_minor="${BASH_REMATCH[1]}"
arch="${BASH_REMATCH[2]}"
platforms=()
for ((minor = glibc_minor; minor >= 5; minor--)); do platforms+=(--platform "manylinux_2_${minor}_${arch}"); done
((glibc_minor >= 17)) && platforms+=(--platform "manylinux2014_${arch}")
((glibc_minor >= 12)) && platforms+=(--platform "manylinux2010_${arch}")
platforms+=(--platform "manylinux1_${arch}")

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
pip_isolated=(env PIP_CONFIG_FILE=/dev/null "${python}" -m pip)
mapfile -t deps < <("${python}" - "${repo}/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["vllm-cuda"]))
PY
)
mkdir -p "${work}/wheels"
if ((${#sdist_only[@]})); then
  "${pip_isolated[@]}" wheel --isolated --index-url "${index}" --quiet --no-deps --no-binary :all: \
    -w "${work}/wheels" "${sdist_only[@]}"
  for whl in "${work}/wheels"/*.whl; do
    [[ "${whl}" == *-none-any.whl ]] || { echo "${whl##*/} is not pure Python: it cannot stand in for ${platform}" >&2; exit 1; }
  done
fi
pins=()
if [[ "${pin_existing}" == 1 && -f "${repo}/ops/image-constraints.txt" ]]; then
  "${python}" - "${repo}/ops/image-constraints.txt" "${unpin[@]}" > "${work}/pins.txt" <<'PY'
import sys
from packaging.utils import canonicalize_name
drop = {canonicalize_name(n) for n in sys.argv[2:]}
for row in open(sys.argv[1]).read().splitlines():
    if row and not row.startswith("#") and canonicalize_name(row.split("==", 1)[0]) not in drop:
        print(row)
PY
  pins=(--constraint "${work}/pins.txt")
fi
"${pip_isolated[@]}" install --isolated --index-url "${index}" --find-links "${work}/wheels" "${pins[@]}" \
  --dry-run --ignore-installed --quiet --report "${work}/report.json" \
  "${platforms[@]}" --python-version 3.11 --implementation cp --only-binary=:all: "${deps[@]}"
"${python}" "${repo}/ops/lock_report.py" "${work}/report.json" "${repo}/ops/image-constraints.txt" \
  "${repo}/tests/k8s/fixtures/wheel-metadata" "${platform}"
echo "wrote ops/image-constraints.txt and tests/k8s/fixtures/wheel-metadata/"
