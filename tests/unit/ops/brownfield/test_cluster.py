"""Broken cluster dumps: fields of another type than kubectl writes, managedFields with bad times or shapes, broken
configs embedded in ConfigMaps, one object in two files, and a dump as large as a real 5,000-node cluster's. Each
is a located error or a note that says what is wrong; the unchanged fixture beside it still imports."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpushare.cli.init import write_workspace
from tests.unit.ops.brownfield.helpers import CLUSTERS, ENV, cli

NODES = "nodes.yaml"
CONFIGMAPS = "configmaps.yaml"


def _dumps(tmp_path: Path, name: str, edits: dict[str, tuple[str, str]]) -> Path:
    """A copy of fixture cluster `name` with each file's first `old` replaced by `new`."""
    out = tmp_path / "dumps"
    shutil.copytree(CLUSTERS / name, out)
    for file, (old, new) in edits.items():
        text = (out / file).read_text()
        assert old in text, (file, old)
        (out / file).write_text(text.replace(old, new, 1))
    return out


def _import(tmp_path: Path, dumps: Path) -> tuple[int, Any]:
    workspace = tmp_path / "ws"
    if not workspace.exists():
        write_workspace(workspace)
    return cli("import", "--from", str(dumps), "--env", ENV, "--out", str(workspace))


# (what, fixture, file, old, new, the path the error names)
WRONG_TYPES = [
    ("a GPU count label unquoted", "default-operator", NODES, 'nvidia.com/gpu.count: "8"', "nvidia.com/gpu.count: 8",
     "items[1].metadata.labels[nvidia.com/gpu.count]"),
    ("labels as a list", "default-operator", NODES,
     "labels: {kubernetes.io/hostname: cp-1, node-role.kubernetes.io/control-plane: \"\"}",
     "labels: [kubernetes.io/hostname]", "items[0].metadata.labels"),
    ("a taint as a string", "default-operator", NODES,
     "taints: [{key: node-role.kubernetes.io/control-plane, effect: NoSchedule}]",
     "taints: [node-role.kubernetes.io/control-plane:NoSchedule]", "items[0].spec.taints[0]"),
    ("an address as a string", "default-operator", NODES, "addresses: [{type: InternalIP, address: 10.0.0.10}",
     "addresses: [10.0.0.10", "items[0].status.addresses[0]"),
    ("ConfigMap data that is a number", "timeslicing-mig", CONFIGMAPS,
     "metadata: {name: time-slicing-config, namespace: gpu-operator}\n    data:\n      ts-2: |",
     "metadata: {name: time-slicing-config, namespace: gpu-operator}\n    data: 7\n    unused:\n      ts-2: |",
     "items[0].data"),
    ("metadata as a string", "default-operator", NODES, "metadata:\n      name: cp-1\n",
     "metadata: cp-1\n    unused:\n      name: cp-1\n", "items[0].metadata"),
    ("a managedFields time that is no time", "default-operator", NODES, "      name: gpu-a100-01\n",
     "      name: gpu-a100-01\n      managedFields: [{manager: gfd, time: yesterday, fieldsV1: {}}]\n",
     "items[1].metadata.managedFields[0].time"),
    ("managedFields whose f:metadata is a string", "default-operator", NODES, "      name: gpu-a100-01\n",
     "      name: gpu-a100-01\n      managedFields: [{manager: gfd, time: '2026-12-01T10:00:00Z', "
     "fieldsV1: {'f:metadata': labels}}]\n", "items[1].metadata.managedFields[0].fieldsV1[f:metadata]"),
    ("managedFields as a mapping", "default-operator", NODES, "      name: gpu-a100-01\n",
     "      name: gpu-a100-01\n      managedFields: {manager: gfd}\n", "items[1].metadata.managedFields"),
]


@pytest.mark.parametrize(("what", "fixture", "file", "old", "new", "path"), WRONG_TYPES,
                         ids=[w[0] for w in WRONG_TYPES])
def test_a_field_of_the_wrong_type_is_a_located_error(tmp_path: Path, what: str, fixture: str, file: str, old: str,
                                                      new: str, path: str) -> None:
    code, out = _import(tmp_path, _dumps(tmp_path, fixture, {file: (old, new)}))
    assert code == 2, out  # unreadable dumps (docs/cli.md)
    problem = out["problems"][0]
    assert problem["file"].endswith(file) and problem["path"] == path, problem
    assert "kubectl get -o yaml" in problem["fix"]
    # The same folder unbroken imports.
    shutil.rmtree(tmp_path / "ws")
    assert _import(tmp_path, CLUSTERS / fixture)[0] == 0


def test_drift_refuses_a_bad_managed_fields_time_and_reads_a_good_one(tmp_path: Path) -> None:
    from gpushare.ops.brownfield.cluster import read_dumps
    from gpushare.ops.brownfield.drift import label_time

    good = _dumps(tmp_path, "default-operator", {NODES: ("      name: gpu-a100-01\n", "      name: gpu-a100-01\n"
                  "      managedFields: [{manager: mig-manager, time: '2026-12-01T10:00:00Z', fieldsV1: "
                  "{'f:metadata': {'f:labels': {'f:nvidia.com/mig.config.state': {}}}}}]\n")})
    node = next(n for n in read_dumps(good).of("Node") if n["metadata"]["name"] == "gpu-a100-01")
    assert label_time(node, "nvidia.com/mig.config.state") is not None
    text = (good / NODES).read_text().replace("'2026-12-01T10:00:00Z'", "'2026-13-45T99:00:00Z'")
    (good / NODES).write_text(text)
    code, out = cli("drift", "--env", "dev", "--from", str(good))
    assert code == 2, out  # bad input, not drift (docs/cli.md)
    assert "not an RFC 3339 time" in out["errors"][0], out


def test_a_word_as_a_kueue_quota_is_noted_not_a_crash(tmp_path: Path) -> None:
    dumps = _dumps(tmp_path, "quotas-kueue", {})
    text = (dumps / "kueue.yaml").read_text()
    changed = re.sub(r"nominalQuota: \"?\d+\"?", "nominalQuota: four", text, count=1)
    assert changed != text
    (dumps / "kueue.yaml").write_text(changed)
    code, out = _import(tmp_path, dumps)
    assert code in (0, 1), out
    assert any("not a whole number" in u["reason"] for u in out["unsupported"]), out["unsupported"]


def _left_out(out: dict[str, Any], node: str) -> str:
    return next(u["reason"] for u in out["unsupported"] if u["object"] == f"Node/{node}"
                and "left out" in u["reason"])


def test_a_key_twice_in_an_embedded_device_plugin_config_is_not_resolved_silently(tmp_path: Path) -> None:
    dumps = _dumps(tmp_path, "timeslicing-mig", {CONFIGMAPS: ("                replicas: 2\n",
                                                              "                replicas: 2\n"
                                                              "                replicas: 8\n")})
    code, out = _import(tmp_path, dumps)
    assert code == 0, out
    reason = _left_out(out, "l40s-01")  # the one node on ts-2
    assert "cannot be read" in reason and "'replicas' appears twice" in reason, reason
    # The nodes on the intact ts-4 still import.
    assert not any(u["object"] == "Node/l4-01" and "left out" in u["reason"] for u in out["unsupported"])


@pytest.mark.parametrize(("old", "new", "said"), [
    ("            resources:\n              - name: nvidia.com/gpu\n                replicas: 2\n",
     "            resources: [\n", "not valid YAML"),
    ("                replicas: 2\n", "                replicas: two\n", "valid integer"),
    ("      ts-2: |\n        version: v1\n", "      ts-2: |\n        - one\n        - two\n      unused: |\n"
     "        version: v1\n", "not a mapping"),
])
def test_an_unreadable_embedded_config_is_reported_as_unreadable_not_missing(tmp_path: Path, old: str, new: str,
                                                                             said: str) -> None:
    dumps = _dumps(tmp_path, "timeslicing-mig", {CONFIGMAPS: (old, new)})
    code, out = _import(tmp_path, dumps)
    assert code == 0, out
    reason = _left_out(out, "l40s-01")
    assert "cannot be read" in reason and said in reason and "lacks it" not in reason, reason


def test_a_mig_parted_entry_that_is_a_string_is_reported(tmp_path: Path) -> None:
    dumps = _dumps(tmp_path, "timeslicing-mig", {CONFIGMAPS: (
        "          all-balanced:\n            - device-filter:", "          all-balanced:\n            - oops\n"
        "          unused:\n            - device-filter:")})
    code, out = _import(tmp_path, dumps)
    assert code == 0, out
    said = " ".join(u["reason"] for u in out["unsupported"])
    assert "mig-configs.all-balanced[0]" in said and "cannot be read" in said, said


def test_a_node_in_two_files_with_other_content_is_refused_and_an_identical_copy_is_one_node(tmp_path: Path) -> None:
    dumps = _dumps(tmp_path, "default-operator", {})
    shutil.copy(dumps / NODES, dumps / "more-nodes.yaml")
    code, out = _import(tmp_path, dumps)
    assert code == 0, out
    assert len([n for n in out["files"] if n.startswith("environments/")]) == 1
    shutil.rmtree(tmp_path / "ws")
    (dumps / "more-nodes.yaml").write_text((dumps / NODES).read_text().replace("10.0.1.12", "10.0.1.99"))
    code, out = _import(tmp_path, dumps)
    assert code == 2, out  # unreadable dumps: which copy the cluster holds cannot be known
    problem = out["problems"][0]
    assert "Node/gpu-a100-02 is also in" in problem["message"] and problem["file"].endswith("nodes.yaml"), problem


def _node(i: int) -> dict[str, Any]:
    name = f"gpu-{i:05d}"
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true",
                                 "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8",
                                 "nvidia.com/mig.config": "all-disabled", "nvidia.com/mig.config.state": "success",
                                 "nvidia.com/cuda.driver.major": "570"},
        "managedFields": [{"manager": "gpu-feature-discovery", "operation": "Update", "time": "2026-12-01T10:00:00Z",
                           "fieldsV1": {"f:metadata": {"f:labels": {"f:nvidia.com/gpu.count": {}}}}}]},
        "spec": {}, "status": {
            "addresses": [{"type": "InternalIP", "address": f"10.{40 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}"}],
            "capacity": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "127", "memory": "1000Gi", "nvidia.com/gpu": "8"},
            "nodeInfo": {"kubeletVersion": "v1.31.4", "osImage": "Ubuntu 24.04.2 LTS"}}}


@pytest.mark.slow
def test_a_5000_node_dump_in_one_file_imports(tmp_path: Path) -> None:
    """docs/adoption.md writes every node to one file: a large cluster's is far above the 4 MiB of a workspace
    file (a real one is ~14 KB a node, 69 MB at 5,000; this test's nodes are smaller to keep it quick)."""
    import yaml

    from gpushare.core.reading import MAX_BYTES

    dumps = _dumps(tmp_path, "default-operator", {})
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [_node(i) for i in range(5000)]})
    (dumps / NODES).write_text(text)
    assert len(text) > MAX_BYTES
    code, out = _import(tmp_path, dumps)
    assert code == 0, out
    env = (tmp_path / "ws" / "environments" / f"{ENV}.yaml").read_text()
    assert env.count("address: 10.") == 5000
