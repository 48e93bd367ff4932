"""`gpushare validate` refuses control characters in every value that reaches a line-based file on a host: the
environment file's own fields (each has a pattern without them), and the site settings in the environment's
group_vars/ and host_vars/ (apt mirrors, suites, key URLs, paths, versions) that the collection's roles write into
apt sources, systemd drop-ins, containerd's TOML and CDI specs. A newline in a mirror URI would add `Trusted: yes`
to the apt source; the error names the file, the line, the variable and the fix, and validate exits 1."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app

runner = CliRunner()


def _validate(path: Path, *extra: str) -> Any:
    return runner.invoke(app, ["validate", "--env", str(path), *extra], env={"COLUMNS": "300"})


def test_a_newline_in_an_apt_mirror_uri_in_group_vars_fails_validate_naming_file_line_and_variable(
        dev_data: dict[str, Any], write_env: Callable[..., Path]) -> None:
    env = write_env(dev_data)
    group_vars = env.parent / "group_vars"
    group_vars.mkdir()
    (group_vars / "all.yml").write_text(
        "# the site's mirror\n"
        "dcgm_apt_uri: \"https://mirror.example/cuda\\nTrusted: yes\"\n"
        "dcgm_apt_key_url: \"\"\n"
        "mig_apt_suite: \"stable\\r\"\n")
    result = _validate(env)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    text = " ".join(result.output.split())
    assert "group_vars/all.yml:2: dcgm_apt_uri" in text, text
    assert "group_vars/all.yml:4: mig_apt_suite" in text, text
    assert "U+000A" in text and "U+000D" in text and "fix:" in text, text
    as_json = json.loads(_validate(env, "--json").output)
    assert as_json["ok"] is False
    assert [(p["path"], p["line"]) for p in as_json["problems"]] == [("dcgm_apt_uri", 2), ("mig_apt_suite", 4)]
    assert all(p["file"].endswith("group_vars/all.yml") and p["fix"] for p in as_json["problems"])


def test_nested_values_host_vars_and_group_folders_are_read_and_good_files_pass(
        dev_data: dict[str, Any], write_env: Callable[..., Path]) -> None:
    env = write_env(dev_data)
    (env.parent / "group_vars" / "pool_a100-inference").mkdir(parents=True)
    (env.parent / "group_vars" / "pool_a100-inference" / "mirror.yaml").write_text(yaml.safe_dump(
        {"nvidia_container_toolkit_packages": ["nvidia-container-toolkit", "libnvidia\tcontainer1"]}))
    (env.parent / "host_vars").mkdir()
    (env.parent / "host_vars" / "dev-a100-01.yml").write_text(yaml.safe_dump(
        {"gpu_sharing_node_labels": {"site.example/rack": "r1\x1b[0m"}}))
    result = _validate(env)
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "nvidia_container_toolkit_packages[1]" in text and "U+0009" in text, text
    assert "gpu_sharing_node_labels.site.example/rack" in text and "U+001B" in text, text

    for bad in (env.parent / "group_vars" / "pool_a100-inference" / "mirror.yaml",
                env.parent / "host_vars" / "dev-a100-01.yml"):
        bad.unlink()
    # What the air-gapped quickstart writes, multi-line content the roles take as a file's body, and a variable
    # the collection does not know (another playbook's, multi-line): all accepted.
    (env.parent / "group_vars" / "env_dev.yml").write_text(
        "nvidia_container_toolkit_apt_uri: https://mirror.example.internal/nvidia/stable/deb/$(ARCH)\n"
        "dcgm_apt_key_url: https://mirror.example.internal/cuda/3bf863cc.pub\n"
        "mig_drain_timeout: 7200\n"
        "mig_parted_config: |\n  version: v1\n  mig-configs:\n    all-disabled:\n\t- devices: all\n"
        "site_motd: |\n  line one\n  line two\n")
    good = _validate(env)
    assert good.exit_code == 0, good.output


def test_vault_values_are_skipped_and_a_file_gpushare_cannot_read_is_a_warning_not_an_error(
        dev_data: dict[str, Any], write_env: Callable[..., Path]) -> None:
    from gpushare.core.site_vars import site_vars_problems

    env = write_env(dev_data)
    (env.parent / "group_vars").mkdir()
    (env.parent / "group_vars" / "all.yml").write_text(
        "mig_kubeconfig: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n"
        "dcgm_apt_suite: !unsafe \"stable\\r\"\n")
    (env.parent / "group_vars" / "env_dev.yml").write_text("dcgm_apt_uri: [unclosed\n")
    problems, warnings = site_vars_problems(env)
    assert [(p.path, p.line) for p in problems] == [("dcgm_apt_suite", 4)], problems
    assert len(warnings) == 1 and "env_dev.yml: not read" in warnings[0], warnings
    result = _validate(env)
    assert result.exit_code == 1 and "U+000D" in result.output, result.output


@pytest.mark.parametrize(("field", "value"), [
    (("defaults", "toolkit_version"), "1.18.2\n"),
    (("defaults", "containerd_version"), "2.1\nTrusted: yes"),
    (("clusters", 0, "kubeconfig_context"), "dev\r"),
    (("pools", 0, "hosts", 0, "address"), "10.40.1.11\n"),
    (("pools", 0, "gpu_model"), "NVIDIA L4\t"),
])
def test_environment_fields_that_reach_host_files_refuse_control_characters(
        dev_data: dict[str, Any], write_env: Callable[..., Path], field: tuple[Any, ...], value: str) -> None:
    target: Any = dev_data
    for part in field[:-1]:
        target = target[part]
    target[field[-1]] = value
    result = _validate(write_env(dev_data))
    assert result.exit_code == 1, result.output
    dotted = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in field).lstrip(".")
    assert dotted in " ".join(result.output.split()), result.output
