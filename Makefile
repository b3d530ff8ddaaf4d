# gpuk8s developer tasks. `make test` is the test command CI runs (.ci/run).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
FLEET   ?= tests/lab/fleets/demo.yaml
LAB_DIR ?= /var/tmp/gpuk8s-lab
# the demo runs what users install: the wheel (built from the sdist) in a venv outside the checkout
DIST_VENV ?= /var/tmp/gpuk8s-dist/venv
DEMO    := $(DIST_VENV)/bin/gpuk8s
LAB_PKGS := openssh-server openssh-client sudo iproute2 iperf3 iputils-ping containerd util-linux openssl procps zstd \
            apt-utils skopeo docker-registry gnupg dpkg \
            python3-yaml gcc libc6-dev


.PHONY: install dist-venv lab-deps test test-interruptions test-unit test-kind lint lab-up lab-down lab-status demo bench bench-smoke clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,lint]'
	touch $@

# sdist, wheel from the sdist, installed with its dependencies into $(DIST_VENV) (tests/wheel.py)
dist-venv: $(DEMO)
$(DEMO): $(VENV)/.installed $(shell git ls-files gpuk8s playbooks 2>/dev/null)
	$(BIN)/python -m tests.wheel $(DIST_VENV) >/dev/null
	touch $@

# What the lab needs from the OS; installed only when missing, only as root on apt systems.
lab-deps:
	@missing=""; for c in /usr/sbin/sshd ssh sudo ip iperf3 ping containerd nsenter openssl gcc zstd skopeo docker-registry apt-ftparchive; do \
	  command -v $$c >/dev/null 2>&1 || missing="$$missing $$c"; done; \
	/usr/bin/python3 -c 'import yaml' 2>/dev/null || missing="$$missing python3-yaml"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "lab-deps: installing ($$missing missing)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(LAB_PKGS) >/dev/null; \
	  else echo "lab-deps: missing$$missing; lab tests will be skipped (need root and: $(LAB_PKGS))"; fi; \
	fi

# pytest workers (pytest-xdist): each lab test's worker drives its own lab (tests/lab/lab.py: INSTANCE, with its own
# directory, bridge, subnet and names); a test file stays on one worker (--dist loadfile: module fixtures shared).
# The 25 slowest tests are listed at the end: where the 12-minute budget goes (docs/testing.md)
TEST_WORKERS ?= 4
test: install lab-deps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

# The interruption matrix at every phase boundary, and SIGINT in every phase of install (make test meets a rotating
# half of each: docs/testing.md)
test-interruptions: install lab-deps
	GPUK8S_INTERRUPT=all $(BIN)/python -m pytest -q -s tests/labtests/test_interruptions.py \
	  tests/labtests/test_faults.py -k 'interruptions or sigint'

test-unit: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests/unit

# The kind smoke tests (docs/kind.md), with the checks of what they apply and of the kind workflow, which need
# nothing. Needs Docker, kind and kubectl; the mock GPU tests also helm and git (the first run fetches and builds
# NVIDIA/k8s-test-infra's nvml-mock). Uses the kind cluster $(GPUK8S_KIND_CLUSTER) if it exists, else makes one from
# tests/kind/kind-config.yaml and deletes it afterwards (GPUK8S_KIND_KEEP=1 keeps it).
GPUK8S_KIND_CLUSTER ?= gpuk8s-test
test-kind: install
	GPUK8S_KIND_CLUSTER=$(GPUK8S_KIND_CLUSTER) $(BIN)/python -m pytest -q -rs tests/kind tests/unit/test_kind_workflow.py

lint: install
	$(BIN)/ruff check gpuk8s tests
	$(BIN)/mypy

lab-up: install lab-deps
	$(BIN)/python -m tests.lab up $(FLEET)

lab-down: install
	$(BIN)/python -m tests.lab down

lab-status: install
	$(BIN)/python -m tests.lab status

demo: install dist-venv lab-deps
	@$(BIN)/python -m tests.lab up $(FLEET) >/dev/null
	@echo "==> lab up: $(FLEET) (real sshd in network namespaces; make demo FLEET=tests/lab/fleets/shared.yaml shows shared GPUs)"
	@echo "==> $(DEMO) preflight -i $(LAB_DIR)/inventory.yaml"
	@$(DEMO) preflight -i $(LAB_DIR)/inventory.yaml; rc=$$?; \
	echo; echo "preflight exit status: $$rc (0: ready, warnings allowed; 1: something failed)"; \
	echo "==> $(DEMO) install -i $(LAB_DIR)/inventory.yaml"; \
	$(DEMO) install -i $(LAB_DIR)/inventory.yaml --kubeconfig-out $(LAB_DIR)/admin.kubeconfig --force; rc=$$?; \
	echo; echo "install exit status: $$rc; run it again: every step is unchanged"; \
	echo "Look around:"; \
	echo "  $(DEMO) preflight -i $(LAB_DIR)/inventory.yaml -o json | less"; \
	echo "  $(DEMO) install -i $(LAB_DIR)/inventory.yaml --dry-run"; \
	echo "  cat $(LAB_DIR)/hosts/gpu-1/upper/etc/containerd/config.toml   # what install wrote on gpu-1"; \
	echo "  ssh -i $(LAB_DIR)/id_ed25519 -o UserKnownHostsFile=$(LAB_DIR)/known_hosts gpuk8s@10.213.0.10 \\"; \
	echo "      sudo kubectl --kubeconfig /etc/kubernetes/admin.conf get nodes   # the lab's simulated cluster"; \
	echo "  (the lab's API server is simulated: a local kubectl cannot use $(LAB_DIR)/admin.kubeconfig)"; \
	echo "  ssh -i $(LAB_DIR)/id_ed25519 -o UserKnownHostsFile=$(LAB_DIR)/known_hosts gpuk8s@10.213.0.11"; \
	echo "  make lab-status"; \
	echo "Take the lab down: make lab-down"

# gpuk8s beside Ansible and the SSH floor at 4, 32, 128 and 512 hosts, RTT 0 and 20 ms, then install at each size
# (tests/bench.py; Ansible goes into the bench's own venv; long: run it when the lab is yours). Result:
# /var/tmp/gpuk8s-bench/bench.json and docs/performance.md.
bench: install lab-deps
	$(BIN)/python -m tests.bench --sweep --doc

# The same at 8 hosts, so that the bench cannot rot: ~25 s (the first run adds pip-installing Ansible, ~1 min).
# Fails, with the figures, when client CPU is more than 2x its budget (tests/bench_budgets.json): a regression.
bench-smoke: install lab-deps
	$(BIN)/python -m tests.bench --sizes 8 --install-sizes 8 --check-budgets --json /var/tmp/gpuk8s-bench/bench-smoke.json

clean:
	[ ! -e $(DIST_VENV)/pyvenv.cfg ] || rm -rf $(DIST_VENV)   # only a venv: a wrong DIST_VENV costs nobody their files
	rm -f $(DIST_VENV)-dist/gpuk8s-*; rmdir $(DIST_VENV)-dist 2>/dev/null || true
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
