"""What the capacity tests share: the environment of the capacity scenarios (tests/prometheus/capacity/), and that
environment with a second MIG pool."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import PROFILES, ROOT

ENV = ROOT / "tests" / "prometheus" / "capacity" / "dev.yaml"  # the environment of the capacity scenarios


# ---------------------------------------------------------------- the proposal: independent pools, grouped changes


def two_mig_pools(tmp_path: Path) -> Path:
    """dev with a second MIG pool like mig-idle in the same cluster: both advertise mig-3g.40gb and mig-4g.40gb."""
    data = yaml.safe_load(ENV.read_text())
    data["pools"].insert(3, {"name": "mig-idle-b", "cluster": "metal-a", "purpose": "inference",
                             "gpu_model": "NVIDIA H100 80GB HBM3", "profile": "mig-llm-serving",
                             "hosts": [{"name": "migb-1", "address": "10.98.4.1", "gpu_count": 2}]})
    env = tmp_path / "environments" / "dev.yaml"
    env.parent.mkdir()
    env.write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "profiles").mkdir()
    for path in PROFILES.glob("*.yaml"):
        (tmp_path / "profiles" / path.name).write_text(path.read_text())
    return env
