"""An environment file gpushare refuses stops Ansible: no other inventory plugin takes an empty or binary
environment file as an inventory of no hosts, and none blocks on a FIFO there; an INI inventory elsewhere and a
valid environment still read (ansible-inventory with the workspace's ansible.cfg)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ansible.testbed import ROOT

pytestmark = pytest.mark.slow  # an ansible-inventory process per case
ANSIBLE_BIN = Path(sys.executable).parent
CONFIGS = [ROOT / "ansible.cfg", ROOT / "gpushare" / "data" / "workspace" / "ansible.cfg"]


def _inventory(path: Path, config: Path) -> subprocess.CompletedProcess[str]:
    from gpushare.core.paths import ansible_environment

    env = {"PATH": f"{ANSIBLE_BIN}:/usr/bin:/bin", "HOME": str(Path.home()), **ansible_environment(ROOT),
           "ANSIBLE_CONFIG": str(config)}
    return subprocess.run([str(ANSIBLE_BIN / "ansible-inventory"), "-i", str(path), "--list"], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("config", CONFIGS, ids=["this repository", "a workspace"])
@pytest.mark.parametrize(("what", "data"), [("empty", b""), ("binary", b"\x00\x01\x02\xff\xfe binary\n"),
                                            ("only a comment", b"# nothing here\n"),
                                            ("INI text", b"[gpus]\ngpu-01 ansible_host=192.0.2.1\n")])
def test_an_environment_file_gpushare_refuses_stops_ansible(tmp_path: Path, config: Path, what: str,
                                                            data: bytes) -> None:
    env_dir = tmp_path / "environments"
    env_dir.mkdir()
    (env_dir / "broken.yaml").write_bytes(data)
    result = _inventory(env_dir / "broken.yaml", config)
    assert result.returncode != 0, result.stdout
    assert "gpushare could not resolve" in result.stderr, result.stderr


@pytest.mark.parametrize("config", CONFIGS, ids=["this repository", "a workspace"])
def test_a_fifo_among_the_environments_does_not_block(tmp_path: Path, config: Path) -> None:
    env_dir = tmp_path / "environments"
    env_dir.mkdir()
    os.mkfifo(env_dir / "fifo.yaml")
    result = _inventory(env_dir / "fifo.yaml", config)  # would hang until the timeout with Ansible's own `auto`
    assert result.returncode != 0


@pytest.mark.parametrize("config", CONFIGS, ids=["this repository", "a workspace"])
def test_an_ini_inventory_elsewhere_and_a_valid_environment_still_read(tmp_path: Path, config: Path) -> None:
    plain = tmp_path / "hosts.ini"
    plain.write_text("plain-host ansible_host=192.0.2.1\n")
    result = _inventory(plain, config)
    assert result.returncode == 0, result.stderr
    assert "plain-host" in json.loads(result.stdout)["_meta"]["hostvars"]
    result = _inventory(ROOT / "environments" / "dev.yaml", config)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["_meta"]["hostvars"]
