"""Values the collection writes into line-based files (apt sources, the mig role's systemd drop-in, containerd's
TOML drop-in, CDI specs) hold no control characters: a newline in a mirror URI would add `Trusted: yes` to the apt
source (signature checks off), one in a config name an `ExecStartPre=` to the unit. Each module runs here as Ansible
runs it (`ansible localhost -m ...`, no test hosts) and must fail naming the option and the character, without a
traceback and without writing anything."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.ansible.test_ansible_modules import ansible_module, rendered_dropin
from tests.ansible.testbed import ROOT

COLLECTION = ROOT / "gpushare" / "ansible_collections" / "gpushare" / "fleet"


def module_json(run: subprocess.CompletedProcess) -> dict:
    """The result `ansible localhost -m MODULE` printed after `localhost | STATUS =>` (Ansible may print the task's
    arguments, braces included, before it)."""
    return json.loads(run.stdout[run.stdout.index("=> {") + 3:])


def refused(run: subprocess.CompletedProcess, option: str, character: str) -> dict:
    """The failed task's result, after checking it names `option` and `character` and shows no traceback."""
    assert run.returncode != 0, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr
    result = module_json(run)
    assert option in result["msg"] and character in result["msg"], result["msg"]
    assert "nothing was written" in result["msg"], result["msg"]
    return result


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# ---------------------------------------------------------------- apt_source


@pytest.mark.parametrize(("option", "value", "character"), [
    ("uri", "https://mirror.example/cuda\nTrusted: yes", "U+000A"),
    ("suite", "stable\r", "U+000D"),
    ("components", ["main", "contrib\tnon-free"], "U+0009"),
    ("keyrings_dir", "/etc/apt/keyrings\x7f", "U+007F"),
])
def test_apt_source_refuses_a_control_character_and_writes_nothing(
        tmp_path: Path, option: str, value: object, character: str) -> None:
    key = tmp_path / "key.asc"
    key.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBF...\n-----END PGP PUBLIC KEY BLOCK-----\n")
    out = tmp_path / "out"
    args = {"name": "nvidia-dcgm", "uri": "https://mirror.example/cuda", "key_url": key.as_uri(),
            "sources_dir": str(out / "sources"), "keyrings_dir": str(out / "keyrings")}
    if option == "keyrings_dir":
        value = str(out / "keyrings") + "\x7f"
    args[option] = value
    refused(ansible_module("gpushare.fleet.apt_source", json.dumps(args)), option, character)
    assert files_under(out) == []  # neither the source nor the key


def test_apt_source_refuses_in_check_mode_too(tmp_path: Path) -> None:
    args = {"name": "nvidia-dcgm", "uri": "file:/srv/cuda", "suite": "/\nTrusted: yes", "trusted": False,
            "key_url": "https://mirror.example/key.asc", "sources_dir": str(tmp_path / "sources"),
            "keyrings_dir": str(tmp_path / "keyrings")}
    bin_dir = Path(sys.executable).parent
    run = subprocess.run([str(bin_dir / "ansible"), "localhost", "-m", "gpushare.fleet.apt_source", "-a",
                          json.dumps(args), "--check"], cwd=ROOT, capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                              "HOME": str(Path.home()), "ANSIBLE_LOCALHOST_WARNING": "False"})
    refused(run, "suite", "U+000A")
    assert files_under(tmp_path) == []


# ---------------------------------------------------------------- cdi_spec


FAKE_CTK = """#!/bin/sh
# nvidia-ctk --quiet cdi generate, as the fixture's: a fixed spec, then the file `extra` beside it.
printf 'cdiVersion: 0.5.0\\nkind: nvidia.com/gpu\\ndevices:\\n- name: all\\n'
printf '%s' "$(cat "$(dirname "$0")/extra" 2>/dev/null)"
"""


def test_cdi_spec_refuses_a_control_character_in_its_path_and_writes_nothing(tmp_path: Path) -> None:
    ctk = executable(tmp_path / "nvidia-ctk", FAKE_CTK)
    out = tmp_path / "out"
    good = ansible_module("gpushare.fleet.cdi_spec", json.dumps({"path": str(out / "nvidia.yaml"),
                                                                 "nvidia_ctk": str(ctk)}))
    assert good.returncode == 0 and module_json(good)["changed"] is True, good.stdout + good.stderr
    (out / "nvidia.yaml").unlink()
    bad = ansible_module("gpushare.fleet.cdi_spec", json.dumps({"path": str(out / "nvidia\n.yaml"),
                                                                "nvidia_ctk": str(ctk)}))
    refused(bad, "path", "U+000A")
    assert files_under(out) == []


def test_cdi_spec_refuses_a_spec_with_control_characters_and_writes_nothing(tmp_path: Path) -> None:
    ctk = executable(tmp_path / "nvidia-ctk", FAKE_CTK)
    (tmp_path / "extra").write_text("  containerEdits: {env: [\"A=\x1b[31mred\"]}\n")
    out = tmp_path / "out"
    bad = ansible_module("gpushare.fleet.cdi_spec", json.dumps({"path": str(out / "nvidia.yaml"),
                                                                "nvidia_ctk": str(ctk)}))
    result = refused(bad, "nvidia-ctk", "U+001B")
    assert "line 5" in result["msg"], result["msg"]
    assert files_under(out) == []


# ---------------------------------------------------------------- containerd_runtime


FAKE_CONTAINERD = """#!{python}
# containerd 2.1 as the module uses it: --version, and `--config FILE config dump`, which merges the imported files
# into the config key by key (containerd 2.x; the main file's version stays) and prints the result as TOML.
import sys, tomllib
sys.dont_write_bytecode = True  # nothing beside the collection's modules
sys.path[:0] = [{library!r}, {package!r}]  # the module, and the collection's module_utils it imports
from containerd_runtime import dumps, merge

if sys.argv[1] == "--version":
    print("containerd github.com/containerd/containerd/v2 v2.1.0 abc")
    sys.exit(0)
with open(sys.argv[2], "rb") as handle:
    config = tomllib.load(handle)
for path in config.get("imports", []):
    with open(path, "rb") as handle:
        config = merge(config, {{k: v for k, v in tomllib.load(handle).items() if k != "version"}})
print(dumps(config), end="")
"""


def fake_containerd(tmp_path: Path) -> Path:
    return executable(tmp_path / "containerd", FAKE_CONTAINERD.format(
        python=sys.executable, library=str(COLLECTION / "plugins" / "modules"), package=str(ROOT / "gpushare")))


@pytest.mark.parametrize(("option", "character"), [
    ("content", "U+001B"),
    ("dropin_path", "U+000A"),
    ("config_path", "U+000D"),
    ("runtime_name", "U+0009"),
])
def test_containerd_runtime_refuses_a_control_character_and_writes_nothing(
        tmp_path: Path, option: str, character: str) -> None:
    containerd = fake_containerd(tmp_path)
    etc = tmp_path / "etc"
    etc.mkdir()
    config = etc / "config.toml"
    config.write_text("version = 2\n")
    args = {"content": rendered_dropin("2.1"), "dropin_path": str(etc / "conf.d" / "99-gpushare-nvidia.toml"),
            "config_path": str(config), "containerd": str(containerd), "runtime_name": "nvidia"}
    args[option] = {"content": args["content"] + "# \x1b[31m\n", "dropin_path": args["dropin_path"] + "\n",
                    "config_path": str(config) + "\r", "runtime_name": "nvidia\t"}[option]
    refused(ansible_module("gpushare.fleet.containerd_runtime", json.dumps(args)), option, character)
    assert files_under(etc) == [config] and config.read_text() == "version = 2\n"


def test_containerd_runtime_writes_the_drop_in_from_good_values(tmp_path: Path) -> None:
    containerd = fake_containerd(tmp_path)
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n")
    dropin = tmp_path / "conf.d" / "99-gpushare-nvidia.toml"
    args = {"content": rendered_dropin("2.1"), "dropin_path": str(dropin), "config_path": str(config),
            "containerd": str(containerd)}
    run = ansible_module("gpushare.fleet.containerd_runtime", json.dumps(args))
    assert run.returncode == 0 and module_json(run)["changed"] is True, run.stdout + run.stderr
    assert dropin.read_text() == rendered_dropin("2.1")
    assert f'imports = ["{dropin}"]' in config.read_text()


def test_containerd_runtime_content_that_is_not_toml_fails_without_a_traceback(tmp_path: Path) -> None:
    containerd = fake_containerd(tmp_path)
    args = {"content": "version = 2\n[plugins\n", "dropin_path": str(tmp_path / "conf.d" / "nvidia.toml"),
            "config_path": str(tmp_path / "config.toml"), "containerd": str(containerd)}
    run = ansible_module("gpushare.fleet.containerd_runtime", json.dumps(args))
    assert run.returncode != 0 and "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr
    assert "content is not TOML" in module_json(run)["msg"]
    assert files_under(tmp_path) == [containerd]


# ---------------------------------------------------------------- the mig role's systemd drop-in


def dropin_play(tmp_path: Path) -> Path:
    """The mig role's task that writes the config and the unit drop-in (roles/mig/tasks/install.yml), as it is,
    in a play on localhost (its handler left out: no unit is reloaded here)."""
    tasks = yaml.safe_load((COLLECTION / "roles" / "mig" / "tasks" / "install.yml").read_text())
    (task,) = [t for t in tasks if "[Service]" in json.dumps(t)]
    task.pop("notify")
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    return play


@pytest.mark.parametrize(("variable", "character"), [
    ("mig_config_name", "U+000A"),
    ("mig_parted_config_path", "U+000D"),
])
def test_the_mig_unit_drop_in_refuses_a_control_character_and_writes_nothing(
        tmp_path: Path, variable: str, character: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    values = {"mig_parted_config_path": str(out / "config.yaml"), "mig_parted_config": "version: v1\n",
              "mig_manager_unit_override": str(out / "zz-gpushare.conf"), "mig_config_name": "gpushare-a"}
    values[variable] += {"mig_config_name": "\nExecStartPre=/bin/touch /tmp/owned",
                         "mig_parted_config_path": "\r"}[variable]
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(values))
    bin_dir = Path(sys.executable).parent
    run = subprocess.run([str(bin_dir / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                          str(dropin_play(tmp_path)), "-e", f"@{extra}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(Path.home()),
                                           "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                                           "ANSIBLE_LOCALHOST_WARNING": "False"})
    assert run.returncode != 0, run.stdout + run.stderr
    assert variable in run.stdout and character in run.stdout, run.stdout
    assert "Traceback" not in run.stdout + run.stderr
    assert files_under(out) == []


def test_the_mig_unit_drop_in_is_written_from_good_values(tmp_path: Path) -> None:
    out = tmp_path / "out"
    values = {"mig_parted_config_path": str(out / "config.yaml"), "mig_parted_config": "version: v1\n",
              "mig_manager_unit_override": str(out / "zz-gpushare.conf"), "mig_config_name": "gpushare-a"}
    out.mkdir()
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(values))
    bin_dir = Path(sys.executable).parent
    run = subprocess.run([str(bin_dir / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                          str(dropin_play(tmp_path)), "-e", f"@{extra}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin",
                                           "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                                           "ANSIBLE_LOCALHOST_WARNING": "False"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert (out / "zz-gpushare.conf").read_text().endswith(
        f'[Service]\nEnvironment="MIG_PARTED_CONFIG_FILE={out / "config.yaml"}"\n'
        'Environment="MIG_PARTED_SELECTED_CONFIG=gpushare-a"\n')
