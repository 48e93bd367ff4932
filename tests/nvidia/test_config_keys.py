"""Every key gpushare renders exists in NVIDIA's config types at the pinned versions.

The device plugin's loader drops keys it does not know without a word, so a misspelt key would pass its own
checks and be lost in production. The key trees (gpushare/data/nvidia-config-keys.yaml) were read from the Go
structs of the pinned commits; this walks every rendered file against them. Needs no NVIDIA program.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.paths import package_data
from tests.nvidia.programs import ENVIRONMENT_FILES, ENVIRONMENT_IDS, nvidia_files

KEYS = yaml.safe_load(package_data("nvidia-config-keys.yaml").read_text())
ANY = "*"


def unknown_keys(doc: Any, tree: Any, path: str = "") -> list[str]:
    """Dotted paths of the keys in `doc` that `tree` does not define (see the data file for the notation)."""
    if tree is None:
        return []
    if isinstance(tree, list):
        items = doc if isinstance(doc, list) else []
        return [key for i, item in enumerate(items) for key in unknown_keys(item, tree[0], f"{path}[{i}]")]
    if not isinstance(doc, dict):
        return []  # a wrong type is the program's own parser's to refuse
    found = []
    for key, value in doc.items():
        where = f"{path}.{key}" if path else str(key)
        if key in tree or ANY in tree:
            found += unknown_keys(value, tree[key] if key in tree else tree[ANY], where)
        else:
            found.append(where)
    return found


def program_for(rel: str) -> str:
    return "mig-parted" if rel.startswith("mig-parted/") else "device-plugin"


@pytest.mark.parametrize("env_file", ENVIRONMENT_FILES, ids=ENVIRONMENT_IDS)
def test_every_rendered_key_is_one_nvidia_defines(env_file: Path) -> None:
    files = nvidia_files(env_file)
    assert "mig-parted/config.yaml" in files and any(rel.startswith("device-plugin/") for rel in files)
    unknown = {rel: unknown_keys(yaml.safe_load(text), KEYS[program_for(rel)]["keys"]) for rel, text in files.items()}
    assert {rel: keys for rel, keys in unknown.items() if keys} == {}


@pytest.mark.parametrize(("program", "doc", "expected"), [
    ("device-plugin", {"version": "v1", "sharing": {"timeSlicing": {"renameByDefualt": True, "resources": [
        {"name": "nvidia.com/gpu", "replicas": 2, "replica": 4}]}}},
     ["sharing.timeSlicing.renameByDefualt", "sharing.timeSlicing.resources[0].replica"]),
    ("device-plugin", {"version": "v1", "flags": {"migStrategy": "mixed", "plugin": {"deviceListStratgy": []}}},
     ["flags.plugin.deviceListStratgy"]),
    ("device-plugin", {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}},
                       "timeSlicing": {}}, ["timeSlicing"]),
    ("mig-parted", {"version": "v1", "mig-configs": {"any-name": [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}, "device_filter": ["0x233010DE"]}]}},
     ["mig-configs.any-name[0].device_filter"]),
], ids=["misspelt-sharing-keys", "misspelt-flag", "sharing-key-at-the-top", "underscore-for-dash"])
def test_a_misspelt_key_is_found(program: str, doc: dict, expected: list[str]) -> None:
    assert unknown_keys(doc, KEYS[program]["keys"]) == expected


def test_the_key_lists_name_their_source() -> None:
    for program, repository in (("device-plugin", "k8s-device-plugin"), ("mig-parted", "mig-parted")):
        entry = KEYS[program]
        assert entry["repository"] == f"https://github.com/NVIDIA/{repository}"
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]) and entry["files"]
    # The same MPS and time-slicing struct (ReplicatedResources), read once.
    sharing = KEYS["device-plugin"]["keys"]["sharing"]
    assert sharing["mps"] == sharing["timeSlicing"]
