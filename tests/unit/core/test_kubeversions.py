"""The Kubernetes minors gpushare supports and what it renders per minor (gpushare.core.kubeversions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpushare.core import kubeversions
from gpushare.core.kubeversions import gate_on_by_default, schema_minor, support_warning
from tests.conftest import ROOT


def test_the_supported_minors_are_the_three_newest_and_the_suite_runs_the_newest() -> None:
    assert kubeversions.supported_text() == "1.35, 1.36, 1.37"
    versions = dict(line.split("=", 1) for line in (ROOT / "tools" / "versions.env").read_text().splitlines()
                    if line and not line.startswith("#"))
    assert kubeversions.minor(versions["KUBERNETES_VERSION"]) == kubeversions.NEWEST


@pytest.mark.parametrize("version", ["1.35", "1.36", "1.37"])
def test_no_warning_inside_the_supported_minors(version: str) -> None:
    assert support_warning("c", version) is None


@pytest.mark.parametrize(("version", "said"), [("1.30", "older"), ("1.34", "older"), ("1.38", "newer")])
def test_a_minor_outside_them_is_named_with_the_supported_ones(version: str, said: str) -> None:
    warning = support_warning("lab", version)
    assert warning is not None
    assert f"cluster lab: Kubernetes {version} is {said}" in warning and "(1.35, 1.36, 1.37)" in warning


@pytest.mark.parametrize(("version", "schema"), [("1.20", "1.25"), ("1.33", "1.33"), ("1.37", "1.37"),
                                                 ("1.40", "1.37")])
def test_objects_meet_the_schemas_of_their_minor_within_the_bundle(version: str, schema: str) -> None:
    assert schema_minor(version) == schema


def test_the_bundle_range_is_what_kubernetes_validate_ships() -> None:
    import kubernetes_validate

    folder = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    bundled = sorted(kubeversions.minor(p.name) for p in folder.glob("v1.*-local-strict"))
    assert (bundled[0], bundled[-1]) == kubeversions.SCHEMA_RANGE


@pytest.mark.parametrize(("gate", "version", "on"), [
    ("DRAConsumableCapacity", "1.35", False), ("DRAConsumableCapacity", "1.36", True),
    ("DRAPartitionableDevices", "1.35", False), ("DRAPartitionableDevices", "1.37", True),
    ("DRADeviceTaints", "1.35", False), ("DRADeviceTaints", "1.36", True),
    ("DRAExtendedResource", "1.35", False), ("DRAExtendedResource", "1.37", True),
    ("DRAAdminAccess", "1.35", True), ("NoSuchGate", "1.37", False)])
def test_dra_gates_follow_the_minors_defaults(gate: str, version: str, on: bool) -> None:
    assert gate_on_by_default(gate, version) is on


def test_no_supported_minor_preempts_pods_for_dra_devices() -> None:
    assert not any(kubeversions.preempts_dra_pods(kubeversions.text(m)) for m in kubeversions.SUPPORTED)


def test_the_environment_format_documents_the_supported_minors() -> None:
    from gpushare.core.spec import Cluster

    description = json.dumps(Cluster.model_json_schema()["properties"]["kubernetes_version"])
    assert "1.35" in description and "1.37" in description
