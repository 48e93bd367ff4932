# Entry points named in README.md. `make plan` and `make test` work from a fresh clone on Debian with Python 3.11+.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: plan test test-cluster test-unit lint venv schema bench clean test-deps promtool testbins nvidia-bins pulumi-bins \
	cluster-up demo-history

plan: venv
	$(BIN)/gpushare plan --env dev
	$(BIN)/gpushare preview --env dev --out build/dev

# The whole suite (tools/run_tests.sh): the Go programs of testbins, pulumi-bins and nvidia-bins build in the
# background from the start (after test-deps), beside venv, lint, promtool and the tests that need none of them; then
# tests/nvidia and each group of tests/cluster run as soon as the programs they need are built.
test:
	$(if $(wildcard ../shared/nvidia-tools/bin),PATH=$(abspath ../shared/nvidia-tools/bin):$$PATH) \
		MAKE="$(MAKE)" tools/run_tests.sh

# The control-plane, Kueue and real-engine tests alone, at the Kubernetes version of tools/versions.env or another one:
#   make test-cluster KUBERNETES_VERSION=1.35.8   (the oldest minor gpushare supports; built once, like the rest)
test-cluster: venv testbins pulumi-bins
	$(BIN)/pytest tests/cluster

# The fast local loop (docs/testing.md): no root-built test hosts, no Prometheus server, no fuzzing; under 3 minutes.
test-unit: venv promtool $(if $(shell command -v go),nvidia-bins)
	$(if $(wildcard ../shared/nvidia-tools/bin),PATH=$(abspath ../shared/nvidia-tools/bin):$$PATH) $(BIN)/pytest -q -m "not slow and not ansible"

# gpushare's Ansible content, the collection gpushare.fleet (playbooks/ links to its playbooks).
COLLECTION := gpushare/ansible_collections/gpushare/fleet

lint: venv
	$(BIN)/ruff check gpushare infra tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_import_cycles.py gpushare
	$(BIN)/yamllint -s environments profiles
	$(BIN)/ruff check $(COLLECTION)
	$(BIN)/yamllint -s $(COLLECTION) tests/ansible
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/ansible-playbook --syntax-check -i localhost, \
		playbooks/site.yml playbooks/rollout.yml playbooks/verify.yml
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/ansible-lint -q -c $(COLLECTION)/.ansible-lint $(COLLECTION)

# What the Go builds (curl and jq read the module proxy's answers, gcc links NVIDIA's cgo programs) and the Ansible
# tests (tests/ansible: debootstrap'd hosts booted with systemd-nspawn, reached over ssh, fed from a local apt
# repository) need on this machine; apt-get runs only when something is missing.
TEST_TOOLS := jq:jq curl:curl gcc:gcc debootstrap:debootstrap systemd-nspawn:systemd-container ssh:openssh-client \
	ssh-keygen:openssh-client ip:iproute2 dpkg-scanpackages:dpkg-dev dpkg-deb:dpkg
test-deps:
	@missing=$$(for t in $(TEST_TOOLS); do command -v $${t%%:*} >/dev/null 2>&1 || echo $${t#*:}; done | sort -u); \
	if [ -n "$$missing" ]; then apt-get update -qq && apt-get install -y -qq $$missing; fi

# promtool and prometheus for the monitoring and capacity tests (Debian's prometheus package), installed only when
# missing. The tests run their own server on 127.0.0.1; the package's service would listen on every interface, so
# it is kept from starting during the install (policy-rc.d, removed again unless it was already there).
promtool:
	@if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then \
	  apt-get update -qq; blocked=; \
	  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; \
	    chmod +x /usr/sbin/policy-rc.d; blocked=1; fi; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; rc=$$?; \
	  if [ -n "$$blocked" ]; then rm -f /usr/sbin/policy-rc.d; fi; exit $$rc; \
	fi

# Kubernetes' own programs, Kueue's controller and the JobSet controller for the control-plane tests (tests/cluster), built from their Go
# modules at the versions in tools/versions.env into ~/.cache/gpushare/bin (GPUSHARE_BIN_CACHE overrides), once per
# version: minutes the first time, nothing after. Needs Go and the Go module proxy.
testbins:
	tools/gobuild.sh etcd
	tools/gobuild.sh kubernetes
	tools/gobuild.sh kwok
	tools/gobuild.sh kueue
	tools/gobuild.sh jobset

# The Pulumi CLI and the Kubernetes provider for the real-engine tests (tests/cluster/test_pulumi_*.py), built the
# same way (`make test` builds them too, beside its first phase).
pulumi-bins:
	tools/gobuild.sh pulumi
	tools/gobuild.sh pulumi-kubernetes

# NVIDIA's mig-parted and device plugin for the parser tests (tests/nvidia), built the same way from their Go modules
# at the versions in tools/versions.env (cgo: needs gcc). `make test-unit` builds them only where Go is installed;
# without Go those tests skip.
nvidia-bins:
	tools/gobuild.sh mig-parted
	tools/gobuild.sh k8s-device-plugin

# A control plane by hand (etcd, kube-apiserver, controller manager, scheduler, kwok on 127.0.0.1): prints the
# kubeconfig to export; ^C stops every process it started.
cluster-up: venv testbins
	$(BIN)/python -m tests.cluster.controlplane --dir build/cluster

venv: $(BIN)/.installed

# pip shows its own progress: bars on a terminal, one line per package (no bars) in CI logs.
$(BIN)/.installed: pyproject.toml
	@python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Python 3.11 or newer is needed"; exit 1; }
	@python3 -c 'import ensurepip, venv' 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv; }
	@echo "Creating $(VENV) and installing gpushare with its dev tools (pip, about 125 packages): 2-4 minutes" \
		"on a fresh clone, once; pip's progress follows"
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install --progress-bar $$([ -t 1 ] && echo on || echo off) -e '.[dev]'
	touch $@

schema: venv
	$(BIN)/gpushare schema --out schema

bench: venv
	$(BIN)/python benchmarks/foundation.py

# The recorded DCGM history `gpushare demo-metrics` serves (gpushare/data/demo/), rewritten from environments/dev.yaml
# by the tests' series generator; tests/unit/ops/test_demo.py fails while it is out of date.
demo-history: venv
	$(BIN)/python scripts/demo_history.py

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
