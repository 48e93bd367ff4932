"""The Pulumi policy pack and `gpushare check` report the same violations for the same input."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyProviderResource,
    PolicyResource,
    PolicyResourceOptions,
)
from pulumi_policy.proxy import UNKNOWN_OBJECT_VALUE, UNKNOWN_STRING_VALUE, unknown_checking_proxy

from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import resolve
from gpushare.ops.preview import collect_plan
from gpushare.policy.evaluate import evaluate
from gpushare.policy.pack import policies, run_pack, stack_of
from gpushare.policy.registry import Context, PlanResource
from gpushare.policy.rules import RULES
from gpushare.policy.waivers import Waiver
from tests.conftest import PROFILES, ROOT, pool_named, tenant_named

TODAY = date(2026, 11, 30)


def resource(stack: str, type_: str, name: str, props: Mapping[str, Any], cluster: str | None = None
             ) -> PolicyResource:
    opts = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
    urn = f"urn:pulumi:{stack}::gpushare::{type_}::{name}"
    provider = None if cluster is None else PolicyProviderResource(
        "pulumi:providers:kubernetes", {}, f"urn:pulumi:{stack}::gpushare::pulumi:providers:kubernetes::{cluster}",
        cluster)
    return PolicyResource(type_, props, urn, name, opts, provider, None, [], {})


@cache
def offline_plan(env: str) -> Any:
    return collect_plan(env)


def stack_resources(stack: str, operator_values: dict[str, Any] | None = None) -> list[PolicyResource]:
    """The stack's resources as the Pulumi engine hands them to a policy pack: the offline plan of its environment,
    optionally with the GPU Operator's values replaced."""
    plan = offline_plan(stack)
    out = [resource(stack, "pulumi:pulumi:Stack", f"gpushare-{stack}", {})]
    for r in plan.resources:
        props = r.inputs
        if operator_values is not None and str(props.get("chart", "")).endswith("gpu-operator"):
            props = {**props, "values": operator_values}
        cluster = plan.cluster_of(r)
        out.append(resource(stack, r.type, r.name, props, None if cluster == "-" else cluster))
    return out


def test_every_rule_is_a_policy_with_its_level() -> None:
    by_name = {p.name: p for p in policies()}
    # A rule whose level the environment decides is a mandatory policy and an advisory one.
    varying = {f"{r.id}-advisory" for r in RULES.values() if r.level_in is not None}
    assert varying == {"tenant-quota-within-capacity-advisory"}
    assert set(RULES) | varying | {"waiver-expired", "waiver-refused"} == set(by_name)
    for r in RULES.values():
        expected = EnforcementLevel.MANDATORY if r.level == "mandatory" else EnforcementLevel.ADVISORY
        assert by_name[r.id].enforcement_level == expected
        assert by_name[r.id].description == r.description
    assert by_name["tenant-quota-within-capacity-advisory"].enforcement_level == EnforcementLevel.ADVISORY


def test_stack_name_comes_from_the_urns() -> None:
    assert stack_of(stack_resources("pilot")) == "pilot"


def test_plan_rules_fire_in_the_pack_when_queues_and_rules_are_missing() -> None:
    dropped = ("kueue.x-k8s.io/v1beta2:LocalQueue", "monitoring.coreos.com/v1:PrometheusRule")
    resources = [r for r in stack_resources("dev") if not r.resource_type.endswith(dropped)]
    found = run_pack(resources, waivers=[], today=TODAY)
    assert set(found) == {"tenant-has-queue", "gpu-pools-monitored"}
    assert any("namespace partner-eval has no Kueue LocalQueue" in m for m in found["tenant-has-queue"])
    assert found["gpu-pools-monitored"] == [
        "cluster dev-metal: no gpushare PrometheusRule (GPU health and sharing alerts) (fix: keep dcgmExporter "
        "enabled in the operator values and the Monitoring component in the program)"]


def test_shipped_stacks_pass_the_pack(shipped_workspace: Path) -> None:
    for stack in ("dev", "pilot", "prod"):
        found = run_pack(stack_resources(stack), waivers=[], today=TODAY)
        assert found == {}, (stack, found)


@pytest.mark.parametrize("waived", [False, True])
def test_pack_and_check_report_the_same(tmp_path: Path, dev_data: dict[str, Any], write_env: Any,
                                        waived: bool) -> None:
    # One input, several violations: an old toolkit, an envvar device list override, an unrenamed shared profile.
    dev_data["defaults"]["toolkit_version"] = "1.17.3"
    dev_data["profiles"] = [{"name": "ts-plain", "kind": "time-slicing",
                             "time_slicing": {"replicas": 2, "rename_by_default": False}}]
    pool_named(dev_data, "l4-notebooks")["profile"] = "ts-plain"
    tenant_named(dev_data, "notebooks")["quota"] = {"nvidia.com/gpu": 4}
    env_file = write_env(dev_data)
    values = {"cdi": {"enabled": True}, "dcgmExporter": {"enabled": True},
              "devicePlugin": {"env": [{"name": "DEVICE_LIST_STRATEGY", "value": "envvar"}]}}
    resources = stack_resources("dev", values)
    waivers = [Waiver(rule="toolkit-cve-floor", environment="dev", where="defaults.toolkit_version",
                      reason="vendor fix lands next week",
                      expires=date(2026, 12, 31))] if waived else []

    ctx = Context(fleet=resolve(env_file, PROFILES), guardrails=load_guardrails(),
                  plan=[PlanResource(r.resource_type, r.name, r.props, r.provider.name if r.provider else "-")
                        for r in resources])
    report = evaluate(ctx, waivers, TODAY)
    from_check: dict[str, list[str]] = {}
    for v in report.violations:
        from_check.setdefault(v.rule, []).append(f"{v.where}: {v.message} (fix: {v.fix})")

    from_pack = run_pack(resources, config={"environment": str(env_file)}, waivers=waivers, today=TODAY)
    assert from_pack == from_check
    assert {"device-list-strategy-not-envvar", "shared-replicas-renamed"} <= set(from_pack)
    assert ("toolkit-cve-floor" in from_pack) is not waived


def test_quota_above_capacity_is_advisory_in_the_pack_where_check_says_so(dev_data: dict[str, Any],
                                                                           write_env: Any) -> None:
    tenant_named(dev_data, "research")["quota"] = {"nvidia.com/gpu": 400}
    found = run_pack(stack_resources("dev"), config={"environment": str(write_env(dev_data))}, waivers=[],
                     today=TODAY)
    assert list(found) == ["tenant-quota-within-capacity-advisory"], found
    assert "guaranteed 400 nvidia.com/gpu" in found["tenant-quota-within-capacity-advisory"][0]


def test_expired_waiver_fails_the_pack(dev_data: dict[str, Any], write_env: Any) -> None:
    waivers = [Waiver(rule="exact-mig-placements", environment="dev", where="*", reason="old exception, long gone",
                      expires=date(2026, 1, 1))]
    found = run_pack(stack_resources("dev"), config={"environment": str(write_env(dev_data))},
                     waivers=waivers, today=TODAY)
    assert list(found) == ["waiver-expired"]


def test_pack_files_exist() -> None:
    assert (ROOT / "policies" / "pack" / "PulumiPolicy.yaml").exists()
    text = (ROOT / "policies" / "pack" / "__main__.py").read_text()
    assert "PolicyPack(" in text and "policies()" in text


def test_pack_judges_by_the_stack_name_not_the_file(dev_data: dict[str, Any], write_env: Any) -> None:
    """Stack prod pointed at an environment that calls itself dev: prod's limits apply, and the identity rule fails."""
    found = run_pack(stack_resources("prod"), config={"environment": str(write_env(dev_data))}, waivers=[],
                     today=TODAY)
    assert found["environment-identity"][0].startswith("environment prod: prod loads ")
    # dev's 4-way L4 time-slicing is within dev's replica limit and above prod's.
    assert any(m.endswith("prod allows 2 (fix: lower the profile's replicas, or move the pool to GPUs (or MIG "
                          "instances) of a larger memory class)") for m in found["shared-replicas-limit"])


def test_refused_waiver_fails_the_pack(dev_data: dict[str, Any], write_env: Any) -> None:
    waivers = [Waiver(rule="exact-mig-placements", environment="dev", where="*", reason="everything, forever",
                      expires=date(2036, 1, 1))]
    found = run_pack(stack_resources("dev"), config={"environment": str(write_env(dev_data))},
                     waivers=waivers, today=TODAY)
    assert list(found) == ["waiver-refused"] and "waivers[0]" in found["waiver-refused"][0]


def test_the_pack_judges_a_first_preview_with_unknown_outputs(dev_data: dict[str, Any], write_env: Any) -> None:
    """As the engine hands them over on a stack's first preview: every property behind pulumi_policy's proxy, which
    raises on reading an unknown value, and outputs such as a Helm release's `status` unknown. Reading one would end
    every stack policy as "can't run during preview" (the real engine showed it); the rules must still judge."""
    dev_data["defaults"]["toolkit_version"] = "1.17.3"  # below the CVE floor
    env_file = write_env(dev_data)
    resources = []
    for r in stack_resources("dev"):
        props = dict(r.props)
        if r.resource_type.startswith("kubernetes:helm.sh/"):
            props["status"] = UNKNOWN_OBJECT_VALUE
            props["resourceNames"] = {"ConfigMap/v1": [UNKNOWN_STRING_VALUE]}
        if r.resource_type == "kubernetes:core/v1:NodePatch":
            props["metadata"] = {**props.get("metadata", {}), "uid": UNKNOWN_STRING_VALUE}
        resources.append(PolicyResource(r.resource_type, unknown_checking_proxy(props), r.urn, r.name, r.opts,
                                        r.provider, None, [], {}))
    assert any(r.resource_type.startswith("kubernetes:helm.sh/") for r in resources)
    found = run_pack(resources, config={"environment": str(env_file)}, waivers=[], today=TODAY)
    assert "toolkit-cve-floor" in found, found
    # What is known is kept and nothing unknown is: the same verdicts as with every value known.
    plain = run_pack(stack_resources("dev"), config={"environment": str(env_file)}, waivers=[], today=TODAY)
    assert found == plain
