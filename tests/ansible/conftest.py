"""Fixtures for gpushare's Ansible tests: isolated test hosts (testbed.py) and the controller (controller.py)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import testinfra
import yaml

from tests.ansible.controller import ENVIRONMENTS, Controller
from tests.ansible.testbed import SSH_OPTIONS, Host, HostSpec, Testbed

# Per-host GPU models as the testbed environment (environments/testbed.yaml) names them. The H100 host cannot reset
# its GPUs (as under GPU passthrough): its first MIG mode change takes the role's one reboot.
HOSTS = [
    HostSpec("tb-a100-01", "NVIDIA A100-SXM4-80GB", 8, nvswitch=True),
    HostSpec("tb-h100-01", "NVIDIA H100 80GB HBM3", 8, nvswitch=True, reset=False),
    HostSpec("tb-l4-01", "NVIDIA L4", 4),
]
TESTBED_ENV = ENVIRONMENTS / "testbed.yaml"


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    if os.geteuid() != 0:
        pytest.skip("the Ansible tests boot test hosts with systemd-nspawn in network namespaces: run as root")
    with Testbed(HOSTS, tag="pytest") as bed:
        yield bed


@pytest.fixture(scope="session")
def testbed_env(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """environments/testbed.yaml with each host at the address this run's test host got."""
    return session_environment(testbed, tmp_path_factory.mktemp("session"))


@pytest.fixture(scope="session")
def controller(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Controller:
    ctl = Controller(tmp_path_factory.mktemp("controller"), testbed.hosts[0].key)
    # The operator labels opted-out hosts nvidia.com/mig.config=all-disabled; verification must ignore it.
    ctl.seed_nodes({h.name: {"kubernetes.io/hostname": h.name, "nvidia.com/mig.config": "all-disabled"}
                    for h in testbed.hosts})
    return ctl


def infra(host: Host):
    """A testinfra host for assertions on host state (files, services, packages)."""
    return testinfra.get_host(f"ssh://root@{host.address}", ssh_identity_file=str(host.key),
                              ssh_extra_args=" ".join(SSH_OPTIONS))


def environment_copy(source: Path, tmp_path: Path, edit=None) -> Path:
    """A copy of an environment file (with its group_vars) that a test may edit, e.g. to change a layout."""
    target = tmp_path / "environments"
    shutil.copytree(source.parent, target, dirs_exist_ok=True)
    path = target / source.name
    if edit is not None:
        data = yaml.safe_load(path.read_text())
        edit(data)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def session_environment(testbed: Testbed, directory: Path, template: Path = TESTBED_ENV) -> Path:
    by_name = {h.name: h.address for h in testbed.hosts}

    def readdress(data: dict) -> None:
        for pool in data["pools"]:
            for host in pool.get("hosts", []):
                host["address"] = by_name[host["name"]]

    return environment_copy(template, directory, readdress)
