"""Every mig-parted config gpushare renders, parsed and selected by NVIDIA's own `nvidia-mig-parted`.

`assert --valid-config` stops after parsing the file and selecting the named config: it never reads or touches a
GPU, so it runs here and on GPU hosts alike.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.nvidia.programs import ENVIRONMENT_FILES, ENVIRONMENT_IDS, Run, nvidia_files, run_all, run_tool

VALID = "Selected MIG configuration is valid"
CONFIG = "mig-parted/config.yaml"


def assert_valid(mig_parted: Path, config: Path, name: str) -> Run:
    return run_tool([mig_parted, "assert", "--valid-config", "-f", config, "-c", name])


def config_names(text: str) -> list[str]:
    return list(yaml.safe_load(text)["mig-configs"])


@pytest.mark.parametrize("env_file", ENVIRONMENT_FILES, ids=ENVIRONMENT_IDS)
def test_every_config_is_parsed_and_selected(mig_parted: Path, env_file: Path, tmp_path: Path) -> None:
    text = nvidia_files(env_file)[CONFIG]
    config = tmp_path / "config.yaml"
    config.write_text(text)
    names = config_names(text)
    assert "all-disabled" in names and len(names) >= 2, "every shipped or fixture environment uses some MIG layout"
    runs = run_all([[mig_parted, "assert", "--valid-config", "-f", config, "-c", name] for name in names])
    failed = {name: run.output for name, run in zip(names, runs, strict=True)
              if run.returncode != 0 or VALID not in run.output}
    assert failed == {}


@pytest.fixture
def rendered_config() -> tuple[str, str]:
    """A rendered mig-parted config and one of its MIG configs (from the first environment file)."""
    text = nvidia_files(ENVIRONMENT_FILES[0])[CONFIG]
    return text, next(n for n in config_names(text) if n != "all-disabled")


@pytest.mark.parametrize(("broken", "says"), [
    (lambda d, n: d["mig-configs"][n][0].pop("mig-enabled"), "missing required field: mig-enabled"),
    (lambda d, n: d["mig-configs"][n][0].update({"mig-enabeld": True}), "unexpected field: mig-enabeld"),
    (lambda d, n: d["mig-configs"][n][0]["mig-devices"].update({"1g.10gbx": 1}), "invalid format for '1g.10gbx'"),
    (lambda d, n: d.update({"version": "v2"}), "unknown version: v2"),
], ids=["missing-key", "misspelt-key", "bad-profile-name", "unknown-version"])
def test_a_broken_config_fails(mig_parted: Path, rendered_config: tuple[str, str], tmp_path: Path,
                               broken: object, says: str) -> None:
    text, name = rendered_config
    data = yaml.safe_load(text)
    broken(data, name)  # type: ignore[operator]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    run = assert_valid(mig_parted, config, name)
    assert run.returncode == 1 and VALID not in run.output
    assert "Error parsing config file" in run.output and says in run.output


def test_a_config_name_the_file_lacks_fails(mig_parted: Path, rendered_config: tuple[str, str],
                                            tmp_path: Path) -> None:
    text, name = rendered_config
    config = tmp_path / "config.yaml"
    config.write_text(text)
    assert VALID in assert_valid(mig_parted, config, name).output
    run = assert_valid(mig_parted, config, name + "-gone")
    assert run.returncode == 1 and f"selected mig-config not present: {name}-gone" in run.output
