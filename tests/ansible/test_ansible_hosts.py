"""The test-host fixture itself: hosts boot with their own systemd, answer ssh, and carry the site's software."""

from __future__ import annotations

import json

import pytest

from tests.ansible.conftest import HOSTS, infra
from tests.ansible.testbed import Testbed

pytestmark = [pytest.mark.ansible, pytest.mark.slow]


def test_hosts_boot_isolated_and_reachable(testbed: Testbed) -> None:
    assert [h.name for h in testbed.hosts] == [s.name for s in HOSTS]
    for host in testbed.hosts:
        target = infra(host)
        assert target.check_output("hostname") == host.name
        assert target.run("systemctl --failed --no-legend --plain").stdout.strip() == ""
        assert target.run("systemctl is-system-running").stdout.strip() == "running"
        # Each host has its own network namespace: its veth (a /30 to the host side) and loopback, no route out.
        assert "default" not in target.check_output("ip route")
        assert target.check_output("ip -o -4 addr show scope global").count("inet ") == 1
        assert target.service("containerd").is_running
        assert target.service("kubelet").is_running
        assert target.file("/srv/gpushare-apt/debian/Packages").exists
        gpus = json.loads(target.check_output("gpusim show"))
        spec = next(s for s in HOSTS if s.name == host.name)
        assert [g["name"] for g in gpus["gpus"]] == [spec.gpu_model] * spec.gpu_count
        assert gpus["driver"] == "580.95.05"
        assert target.service("nvidia-fabricmanager").is_running == spec.nvswitch
