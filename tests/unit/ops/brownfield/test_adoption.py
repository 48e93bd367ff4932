"""The adoption stage, offline: an import of a cluster as NVIDIA's docs set it up passes `gpushare check` as the
cluster runs, into the shipped strict `prod` (promoted from a pilot the workspace lacks) and into a new environment
the guardrails do not name; what the first rollout renders keeps what runs; each staged guard moves in a reviewed
step; and bad adoption input is refused with its file, field and fix."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.cli.init import write_workspace
from tests.conftest import ROOT
from tests.unit.ops.brownfield.helpers import CLUSTERS, cli

DOCS = CLUSTERS / "docs-timeslicing"


def adopt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str) -> tuple[Path, dict[str, Any]]:
    workspace = tmp_path / "ws"
    write_workspace(workspace)
    code, out = cli("import", "--from", str(DOCS), "--env", env, "--out", str(workspace))
    assert code == 0, out
    monkeypatch.setenv("GPUSHARE_ROOT", str(workspace))
    path = workspace / "environments" / f"{env}.yaml"
    # the one thing a dump cannot say (the import's first `next:` step); a live import writes it itself
    path.write_text(path.read_text().replace("  cdi: true\n", "  cdi: true\n  kubeconfig_context: admin\n"))
    return workspace, out


def edit_env(workspace: Path, env: str, old: str, new: str) -> None:
    path = workspace / "environments" / f"{env}.yaml"
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


def manifests(workspace: Path, env: str) -> dict[str, dict[str, Any]]:
    code, out = cli("preview", "--env", env, "--out", str(workspace / "build" / env))
    assert code == 0, out
    found: dict[str, dict[str, Any]] = {}
    for path in (workspace / "build" / env / "manifests" / env).glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                meta = doc["metadata"]
                found[f"{doc['kind']} " + (f"{meta['namespace']}/" if meta.get("namespace") else "") +
                      meta["name"]] = doc
    return found


def test_an_import_into_strict_prod_passes_check_with_dated_waivers(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    workspace, out = adopt(tmp_path, monkeypatch, "prod")
    # prod's guardrails are the shipped ones: nothing is loosened, what the cluster breaks is waived one place each
    assert "policies/guardrails.d/prod.yaml" not in out["files"]
    waived = {(w["rule"], w["where"]) for w in out["adoption"]["waived"]}
    assert ("promotion-from-pilot", "environment prod") in waived  # pilot does not exist here: said, not a crash
    assert ("shared-replicas-renamed", "profile tesla-t4") in waived  # renaming would break what asks nvidia.com/gpu
    assert out["adoption"]["remediation"] == []
    waivers = yaml.safe_load((workspace / "policies" / "waivers.d" / "prod-adoption.yaml").read_text())["waivers"]
    assert {(w["rule"], w["where"]) for w in waivers} == waived
    assert all(w["expires"] == w["expires"] and "to do:" in w["reason"] for w in waivers)
    code, report = cli("check", "--env", "prod")
    assert code == 0, report["violations"]
    assert {(v["rule"], v["where"]) for v in report["waived"]} == waived
    staged = {v["where"] for v in report["violations"] if v["rule"] == "adoption-staged"}
    assert staged == {f"environment prod, adoption.{f}" for f in ("admission", "pod_security", "shared_gpu_taint",
                                                                  "host_defaults")}


def test_an_import_into_a_new_environment_gets_limits_measured_on_the_cluster(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    workspace, out = adopt(tmp_path, monkeypatch, "east")
    limits = yaml.safe_load((workspace / "policies" / "guardrails.d" / "east.yaml").read_text())["environments"]
    east = limits["east"]
    # T4s time-sliced 4 ways (16 GiB: small), 7 MIG instances per A100 and whole H100s: (32+112+8)/(8+112+8)
    assert east["max_oversubscription"] == 1.19
    assert east["max_shared_replicas"] == {"small": 4, "medium": 2, "large": 2}
    assert east["allowed_profiles"] == ["all-1g-10gb", "exclusive", "tesla-t4"]
    assert "untrusted-tenants-need-enforced-admission" in east["non_waivable"]
    code, report = cli("check", "--env", "east")
    assert code == 0, report["violations"]
    # the main file is never edited
    shipped = (ROOT / "gpushare" / "data" / "workspace" / "policies" / "guardrails.yaml")
    assert (workspace / "policies" / "guardrails.yaml").read_text() == shipped.read_text()


def test_the_first_rollout_of_an_adopted_cluster_keeps_what_runs(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    workspace, _ = adopt(tmp_path, monkeypatch, "prod")
    objects = manifests(workspace, "prod")
    # The cluster's own quota, taken over in place; what it never limited stays unlimited.
    assert objects["ResourceQuota ml-research/gpu-quota"]["spec"]["hard"] == {"requests.nvidia.com/gpu": "8"}
    assert not [k for k in objects if k.startswith("ResourceQuota ") and "gpushare-gpu-quota" in k]
    assert not [k for k in objects if k.startswith("LimitRange ")]
    # Trusted as today; Pod Security warns and audits, enforces nothing (the namespace's own enforce label stays).
    labels = objects["Namespace notebooks"]["metadata"]["labels"]
    assert labels["gpushare.io/trust"] == "trusted"
    assert "pod-security.kubernetes.io/enforce" not in labels and labels["pod-security.kubernetes.io/warn"] == \
        "baseline"
    # Admission warns and audits: nothing running is refused.
    bindings = [o for o in objects.values() if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert bindings and all(b["spec"]["validationActions"] == ["Warn", "Audit"] for b in bindings)
    # No new taint under the running pods; the operator's config keys the nodes name are kept beside gpushare's.
    assert "taints" not in objects["Node t4-01"].get("spec", {})
    data = objects["ConfigMap gpu-operator/gpushare-device-plugin-configs"]["data"]
    assert yaml.safe_load(data["tesla-t4"]) == yaml.safe_load(
        yaml.safe_load((DOCS / "configmaps.yaml").read_text())["items"][0]["data"]["tesla-t4"])
    # The cluster's own PriorityClasses of gpushare's values stay the ones pods name: no second class beside them.
    assert not [k for k in objects if k.startswith("PriorityClass ")]
    policy = objects["ValidatingAdmissionPolicy gpushare-tenant-priority-class"]["spec"]["validations"][0]
    assert "['high-priority', 'low-priority']" in policy["expression"]
    # The Prometheus stack the ClusterPolicy shows is reused, not installed twice.
    stack = yaml.safe_load((workspace / "Pulumi.prod.yaml").read_text())["config"]
    assert stack["gpushare:monitoring"]["mode"] == "existing"
    assert stack["gpushare:keepDevicePluginConfigs"] == [
        {"name": "tesla-t4", "file": "imports/prod-configs/tesla-t4.yaml", "adopted": True}]


def test_each_staged_guard_moves_in_a_step_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    workspace, _ = adopt(tmp_path, monkeypatch, "prod")
    for old, new in (("admission: warn", "admission: deny"), ("pod_security: warn", "pod_security: enforce"),
                     ("shared_gpu_taint: false", "shared_gpu_taint: true"),
                     ("host_defaults: false", "host_defaults: true")):
        edit_env(workspace, "prod", old, new)
    objects = manifests(workspace, "prod")
    assert objects["ValidatingAdmissionPolicyBinding gpushare-gpu-pods-queued"]["spec"]["validationActions"] == \
        ["Deny"]
    assert objects["Namespace notebooks"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    assert {"key": "gpushare.io/shared-gpu", "value": "true", "effect": "NoSchedule"} in \
        objects["Node t4-01"]["spec"]["taints"]
    assert "LimitRange ml-research/gpushare-host-defaults" in objects
    hard = objects["ResourceQuota ml-research/gpu-quota"]["spec"]["hard"]
    assert hard["requests.nvidia.com/mig-1g.10gb"] == "0"  # now every advertised resource is limited
    code, report = cli("check", "--env", "prod")
    assert code == 0 and not [v for v in report["violations"] if v["rule"] == "adoption-staged"]


def test_an_untrusted_tenant_needs_enforcing_guards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    workspace, _ = adopt(tmp_path, monkeypatch, "east")
    edit_env(workspace, "east", "  namespace: notebooks\n  trust: trusted\n", "  namespace: notebooks\n  trust: "
             "untrusted\n")
    code, report = cli("check", "--env", "east")
    assert code == 1
    failed = {(v["rule"], v["where"]) for v in report["violations"] if v["level"] == "mandatory"}
    assert ("untrusted-tenants-need-enforced-admission", "tenant notebooks") in failed


def test_bad_adoption_input_is_refused_with_file_field_and_fix(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    workspace, _ = adopt(tmp_path, monkeypatch, "east")
    edit_env(workspace, "east", "admission: warn", "admission: audit")
    code, out = cli("validate", "--env", "east")
    assert code == 1 and "adoption.admission" in str(out["errors"])
    edit_env(workspace, "east", "admission: audit", "admission: warn")
    # An environment's limits in two files: refused, naming the second.
    (workspace / "policies" / "guardrails.d" / "zz-again.yaml").write_text(
        (workspace / "policies" / "guardrails.d" / "east.yaml").read_text())
    code, out = cli("check", "--env", "east")
    assert code == 1 and "zz-again.yaml" in str(out) and "limits in guardrails.d/east.yaml already" in str(out)
    (workspace / "policies" / "guardrails.d" / "zz-again.yaml").unlink()
    # A waivers.d file with a bad entry: located in that file.
    (workspace / "policies" / "waivers.d" / "bad.yaml").write_text(
        "apiVersion: gpushare.io/v1\nkind: Waivers\nwaivers:\n  - rule: no-such-rule\n    environment: east\n"
        "    where: x\n    reason: because it is so\n    expires: '2026-12-31'\n")
    code, out = cli("check", "--env", "east")
    assert code in (1, 2) and "bad.yaml" in str(out) and "no rule named" in str(out)


def test_the_running_operator_release_is_taken_over_never_installed_twice(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _, out = adopt(tmp_path / "same", monkeypatch, "prod")
    step = next(s for s in out["next"] if "pulumi import" in s)
    assert "kubernetes:helm.sh/v3:Release prod-nvidia-gpu-operator gpu-operator/gpu-operator" in step
    # NVIDIA's docs install with --generate-name: a release of another name cannot be taken over, and the import
    # says so first thing, instead of a rollout that would run a second operator beside it.
    dumps = tmp_path / "generated"
    shutil.copytree(DOCS, dumps)
    policy = dumps / "clusterpolicies.yaml"
    policy.write_text(policy.read_text().replace("release-name: gpu-operator,", "release-name: gpu-operator-1733,"))
    workspace = tmp_path / "other"
    write_workspace(workspace)
    code, out = cli("import", "--from", str(dumps), "--env", "prod", "--out", str(workspace))
    assert code == 0, out
    remediation = [s for s in out["next"] if s.startswith("REMEDIATION")]
    assert remediation and "'gpu-operator-1733'" in remediation[0] and "second operator" in remediation[0]
