"""Every guardrail rule fires on an environment that breaks it (with its id and location) and stays quiet
on one that keeps it; waivers and the guardrails file reject bad input."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.errors import GpushareError
from gpushare.core.guardrails import load_guardrails
from gpushare.core.nvidia.operator import effective_device_list_strategy
from gpushare.core.resolve import resolve, resolve_env
from gpushare.policy.evaluate import evaluate
from gpushare.policy.registry import Context, PlanResource, Violation
from gpushare.policy.rules import RULES
from gpushare.policy.waivers import load_waivers
from tests.conftest import PROFILES, ROOT, WORKSPACE, pool_named, tenant_named

TODAY = date(2026, 11, 30)


def context(write_env: Any, data: dict[str, Any], source: Any = None, plan: Any = None) -> Context:
    return Context(fleet=resolve(write_env(data), PROFILES), guardrails=load_guardrails(),
                   promotion_source=source, plan=plan)


def fired(ctx: Context, rule: str) -> list[Violation]:
    return RULES[rule].run(ctx)


@pytest.mark.parametrize("env", ["dev", "pilot", "prod"])
def test_shipped_environments_pass(env: str, shipped_workspace: Path) -> None:
    g = load_guardrails()
    limits = g.environment(env)
    ctx = Context(resolve_env(env), g, promotion_source=resolve_env(limits.promote_from) if limits.promote_from
                  else None)
    report = evaluate(ctx, [], TODAY)
    assert report.ok, [v.as_dict() for v in report.violations]
    assert report.violations == []


Mutate = Callable[[dict[str, Any]], None]


def _name_env(name: str) -> Mutate:
    return lambda d: d.__setitem__("name", name)


def _many_replicas(d: dict[str, Any]) -> None:
    d.setdefault("profiles", []).append({"name": "ts8", "kind": "time-slicing", "time_slicing": {"replicas": 8}})
    pool_named(d, "l4-notebooks")["profile"] = "ts8"


def _oversubscribed(d: dict[str, Any]) -> None:
    # Only L4s, time-sliced 4 ways: ratio 4.0, above prod's 1.5 (checked as prod)
    d["name"] = "prod"
    d["pools"] = [pool_named(d, "l4-notebooks")]
    d["tenants"] = []


def _untrusted_shared(d: dict[str, Any]) -> None:
    tenant_named(d, "partner-eval")["quota"] = {"nvidia.com/gpu.shared": 2}


def _untrusted_unrenamed(d: dict[str, Any]) -> None:
    d.setdefault("profiles", []).append({"name": "ts-plain", "kind": "time-slicing",
                                         "time_slicing": {"replicas": 2, "rename_by_default": False}})
    pool_named(d, "l4-notebooks")["profile"] = "ts-plain"
    tenant_named(d, "notebooks")["quota"] = {"nvidia.com/gpu": 4}
    tenant_named(d, "partner-eval")["quota"] = {"nvidia.com/gpu": 1}


def _no_fail_requests(d: dict[str, Any]) -> None:
    d["name"] = "prod"
    d.setdefault("profiles", []).append({"name": "ts2-lax", "kind": "time-slicing",
                                         "time_slicing": {"replicas": 2, "fail_requests_greater_than_one": False}})
    pool_named(d, "l4-notebooks")["profile"] = "ts2-lax"


def _old_toolkit(d: dict[str, Any]) -> None:
    d["defaults"]["toolkit_version"] = "1.17.4"


def _inferred_placements(d: dict[str, Any]) -> None:
    d["name"] = "prod"
    pool_named(d, "a100-inference")["gpu_model"] = "NVIDIA B200"
    d["tenants"] = []


def _not_allowed(d: dict[str, Any]) -> None:
    d["name"] = "prod"
    pool_named(d, "a100-inference")["profile"] = "mig-small-ts2"
    d["tenants"] = []


def _quota_above_capacity(d: dict[str, Any]) -> None:
    d["name"] = "pilot"  # pilot refuses guaranteed quota above what the cluster advertises
    tenant_named(d, "research")["quota"] = {"nvidia.com/gpu": 400}


def _no_quota(d: dict[str, Any]) -> None:
    tenant_named(d, "research")["quota"] = {}


CASES: list[tuple[str, Mutate, str | tuple[str, ...]]] = [
    ("shared-replicas-limit", _many_replicas, "pool l4-notebooks"),
    ("oversubscription-limit", _oversubscribed, "environment prod"),
    ("untrusted-tenants-hardware-isolated", _untrusted_shared, "tenant partner-eval, quota nvidia.com/gpu.shared"),
    # The quota, and the ClusterQueue that spills it onto the time-sliced flavor once the whole GPUs are taken.
    ("untrusted-tenants-hardware-isolated", _untrusted_unrenamed,
     ("tenant partner-eval, quota nvidia.com/gpu",
      "tenant partner-eval, ClusterQueue tenant-partner-eval, flavor l4-notebooks")),
    ("shared-replicas-renamed", _untrusted_unrenamed, "profile ts-plain"),
    ("fail-requests-greater-than-one", _no_fail_requests, "profile ts2-lax"),
    ("toolkit-cve-floor", _old_toolkit, "defaults.toolkit_version"),
    ("exact-mig-placements", _inferred_placements, "pool a100-inference"),
    ("profile-allowed", _not_allowed, "pool a100-inference, host dev-a100-01"),
    ("tenant-has-quota", _no_quota, "tenant research"),
    ("tenant-quota-within-capacity", _quota_above_capacity, "tenants[1].quota.nvidia.com/gpu"),
]


@pytest.mark.parametrize(("rule", "mutate", "where"), CASES, ids=[f"{c[0]}:{c[1].__name__}" for c in CASES])
def test_rule_fires(rule: str, mutate: Mutate, where: str | tuple[str, ...], dev_data: dict[str, Any],
                    write_env: Any) -> None:
    clean = context(write_env, dev_data)
    assert fired(clean, rule) == [] or clean.fleet.environment != dev_data["name"]
    mutate(dev_data)
    ctx = context(write_env, dev_data)
    violations = fired(ctx, rule)
    assert [v.where for v in violations] == ([where] if isinstance(where, str) else list(where)), \
        [v.as_dict() for v in violations]
    v = violations[0]
    assert v.rule == rule and v.level == "mandatory" and v.fix and v.message


def test_quota_above_capacity_is_one_rule_advisory_where_validate_only_warns(dev_data: dict[str, Any],
                                                                          write_env: Any) -> None:
    """dev allows it (quota_above_capacity: warning): validate warns, and check lists it as an advisory failure
    without failing; pilot refuses it: the same rule, mandatory. One id either way, so check never prints `pass`
    and `FAIL` of the same excess under two names."""
    tenant_named(dev_data, "research")["quota"] = {"nvidia.com/gpu": 400}
    path = write_env(dev_data)
    warned = CliRunner().invoke(app, ["validate", "--env", str(path), "--json"])
    assert warned.exit_code == 0 and any("guaranteed 400 nvidia.com/gpu" in w
                                         for w in json.loads(warned.stdout)["warnings"])
    checked = CliRunner().invoke(app, ["check", "--env", str(path), "--json", "--no-plan"])
    assert checked.exit_code == 0, checked.output
    (v,) = [v for v in json.loads(checked.stdout)["violations"] if "quota" in v["rule"]]
    assert (v["rule"], v["level"], v["where"]) == ("tenant-quota-within-capacity", "advisory",
                                                   "tenants[1].quota.nvidia.com/gpu")
    assert "guaranteed 400 nvidia.com/gpu" in v["message"] and v["fix"]
    table = CliRunner().invoke(app, ["check", "--env", str(path), "--no-plan"], env={"COLUMNS": "250"}).stdout
    said = [line for line in table.splitlines() if "capacity" in line and "quota" in line]
    assert len(said) == 1 and "FAIL (advisory)" in said[0] and "tenant-quota-within-capacity" in said[0], said
    _quota_above_capacity(dev_data)
    assert [v.level for v in fired(context(write_env, dev_data), "tenant-quota-within-capacity")] == ["mandatory"]


def test_a_borrowing_limit_above_the_cluster_warns_in_dev_and_is_refused_in_pilot(dev_data: dict[str, Any],
                                                                                  write_env: Any) -> None:
    """A tenant's ResourceQuota is its guarantee plus its borrowing limit: 8 guaranteed and 400 borrowable GPUs in a
    cluster of 8 passed validate and check in dev without a word. Now the same rule and guardrail as a guarantee
    above the cluster: validate warns and check lists it as advisory in dev; pilot refuses it in validate, plan and
    check."""
    tenant_named(dev_data, "research")["borrowing_limit"] = {"nvidia.com/gpu": 400}
    path = write_env(dev_data)
    warned = CliRunner().invoke(app, ["validate", "--env", str(path), "--json"])
    assert warned.exit_code == 0, warned.output
    said = [w for w in json.loads(warned.stdout)["warnings"] if "400 nvidia.com/gpu" in w]
    assert said == ["cluster dev-metal: tenant research may borrow 400 nvidia.com/gpu beside its 8 guaranteed (its "
                    "ResourceQuota allows 408) but the pools advertise 8"], json.loads(warned.stdout)["warnings"]
    checked = CliRunner().invoke(app, ["check", "--env", str(path), "--json", "--no-plan"])
    assert checked.exit_code == 0, checked.output
    (v,) = [v for v in json.loads(checked.stdout)["violations"] if "quota" in v["rule"]]
    assert (v["rule"], v["level"], v["where"]) == ("tenant-quota-within-capacity", "advisory",
                                                   "tenants[1].borrowing_limit.nvidia.com/gpu")
    # Within the cluster it says nothing: 8 guaranteed beside what the pools have left to lend is fine.
    tenant_named(dev_data, "research")["quota"] = {"nvidia.com/gpu": 6}
    tenant_named(dev_data, "research")["borrowing_limit"] = {"nvidia.com/gpu": 2}
    assert fired(context(write_env, dev_data), "tenant-quota-within-capacity") == []
    tenant_named(dev_data, "research")["borrowing_limit"] = {"nvidia.com/gpu": 3}
    (v,) = fired(context(write_env, dev_data), "tenant-quota-within-capacity")
    assert "may borrow 3" in v.message and "allows 9" in v.message and "advertise 8" in v.message, v.message
    # pilot refuses it: validate fails with the file, the line, the field and the fix
    dev_data["name"] = "pilot"
    tenant_named(dev_data, "research")["borrowing_limit"] = {"nvidia.com/gpu": 400}
    path = write_env(dev_data)
    refused = CliRunner().invoke(app, ["validate", "--env", str(path), "--json"])
    assert refused.exit_code == 1, refused.output
    (problem,) = [p for p in json.loads(refused.stdout)["problems"] if "borrow" in p["message"]]
    assert problem["file"] == str(path) and problem["line"] and problem["path"] == \
        "tenants[1].borrowing_limit.nvidia.com/gpu" and "lower the borrowing limit" in problem["fix"], problem
    assert [v.level for v in fired(context(write_env, dev_data), "tenant-quota-within-capacity")] == ["mandatory"]


def test_waivers_naming_the_old_quota_rule_id_still_work(tmp_path: Path, dev_data: dict[str, Any],
                                                         write_env: Any) -> None:
    """tenant-quota-above-capacity is now the advisory level of tenant-quota-within-capacity: a waiver file (or
    non_waivable) naming the old id still loads and covers what the old rule reported, and nothing more."""
    tenant_named(dev_data, "research")["quota"] = {"nvidia.com/gpu": 400}
    # `where` is a glob: [[] is a literal [.
    waiver = {"rule": "tenant-quota-above-capacity", "environment": "dev", "where": "tenants[[]1].quota.nvidia.com/gpu",
              "reason": "GPUs for research arrive next month", "expires": "2026-12-31"}
    waivers, file = load_waivers(_waivers(tmp_path, [waiver]))
    rules = [RULES["tenant-quota-within-capacity"]]
    report = evaluate(context(write_env, dev_data), waivers, TODAY, file, rules=rules)
    assert report.violations == [] and [v.rule for v, _ in report.waived] == ["tenant-quota-within-capacity"]
    checked = CliRunner().invoke(app, ["check", "--env", str(write_env(dev_data)), "--json", "--no-plan",
                                       "--waivers", str(file), "--today", TODAY.isoformat()])
    assert checked.exit_code == 0, checked.output
    assert [w["rule"] for w in json.loads(checked.stdout)["waived"]] == ["tenant-quota-within-capacity"]
    # Where the rule is mandatory, the old id never covered it, and still does not.
    _quota_above_capacity(dev_data)
    waivers, file = load_waivers(_waivers(tmp_path, [{**waiver, "environment": "pilot"}]))
    report = evaluate(context(write_env, dev_data), waivers, TODAY, file, rules=rules)
    assert [v.level for v in report.violations] == ["mandatory"] and report.waived == []
    # non_waivable may name the old id too.
    from gpushare.policy.context import load_checked_guardrails

    data = yaml.safe_load((WORKSPACE / "policies" / "guardrails.yaml").read_text())
    data["environments"]["dev"]["non_waivable"] = ["tenant-quota-above-capacity"]
    guardrails = tmp_path / "guardrails.yaml"
    guardrails.write_text(yaml.safe_dump(data))
    dev_data["name"] = "dev"
    ctx = Context(fleet=resolve(write_env(dev_data), PROFILES), guardrails=load_checked_guardrails(guardrails))
    waivers, file = load_waivers(_waivers(tmp_path, [waiver]), ctx.guardrails)
    report = evaluate(ctx, waivers, TODAY, file, rules=rules)
    assert "waiver-refused" in {v.rule for v in report.violations} and report.waived == []


def test_every_rule_is_in_the_guardrails_doc() -> None:
    table = (ROOT / "docs" / "guardrails.md").read_text()
    assert [r for r in RULES if f"\n| `{r}`" not in table] == []


def test_cve_floor_names_the_cves(dev_data: dict[str, Any], write_env: Any) -> None:
    _old_toolkit(dev_data)
    (v,) = fired(context(write_env, dev_data), "toolkit-cve-floor")
    assert "CVE-2025-23266" in v.message and "GHSA-qw9x-cqr3-wc7r" in v.message
    assert "CVE-2024-0132" not in v.message


def test_toolkit_hardening_is_read_from_the_rendered_file(dev_data: dict[str, Any], write_env: Any) -> None:
    ctx = context(write_env, dev_data)
    assert fired(ctx, "toolkit-hardened") == []
    from gpushare.render.fleet import render_fleet

    files = dict(render_fleet(ctx.fleet).files)
    files["nvidia-container-toolkit/config.toml"] = files["nvidia-container-toolkit/config.toml"].replace(
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false",
        "accept-nvidia-visible-devices-envvar-when-unprivileged = true")
    ctx.rendered = files
    (v,) = fired(ctx, "toolkit-hardened")
    assert "envvar-when-unprivileged" in v.message


def test_device_list_strategy_follows_operator_overrides(dev_data: dict[str, Any], write_env: Any) -> None:
    cfg = {"flags": {"plugin": {"deviceListStrategy": ["volume-mounts"]}}}
    assert effective_device_list_strategy(cfg, None) == ["volume-mounts"]
    assert effective_device_list_strategy({}, None) == ["envvar"]
    assert effective_device_list_strategy(cfg, {"cdi": {"enabled": True}}) == ["cdi-annotations", "cdi-cri"]
    env = {"cdi": {"enabled": True}, "devicePlugin": {"env": [{"name": "DEVICE_LIST_STRATEGY", "value": "envvar"}]}}
    assert effective_device_list_strategy(cfg, env) == ["envvar"]

    ctx = context(write_env, dev_data)
    assert fired(ctx, "device-list-strategy-not-envvar") == []
    ctx.plan = [PlanResource("kubernetes:helm.sh/v3:Release", "dev-metal-gpu-operator",
                             {"chart": "gpu-operator", "values": {"cdi": {"enabled": False},
                                                                   "devicePlugin": {"env": [
                                                                       {"name": "DEVICE_LIST_STRATEGY",
                                                                        "value": "envvar"}]}}})]
    violations = fired(ctx, "device-list-strategy-not-envvar")
    assert violations and all("dev-metal-gpu-operator" in v.where for v in violations)


def test_promotion_rule(dev_data: dict[str, Any], write_env: Any) -> None:
    pilot = resolve_env("pilot")
    dev_data["name"] = "prod"
    assert fired(context(write_env, dev_data, source=pilot), "promotion-from-pilot") == []
    pool_named(dev_data, "a100-inference")["profile"] = "mig-small"
    dev_data["tenants"] = []
    dev_data["defaults"]["toolkit_version"] = "1.18.3"
    wheres = {v.where: v.message for v in fired(context(write_env, dev_data, source=pilot), "promotion-from-pilot")}
    assert "does not run in pilot" in wheres["pool a100-inference"]
    assert "toolkit version 1.18.3" in wheres["defaults.toolkit_version"]


# ---------------------------------------------------------------- waivers


def _waivers(tmp_path: Path, items: list[dict[str, Any]]) -> Path:
    path = tmp_path / "waivers.yaml"
    path.write_text(yaml.safe_dump({"waivers": items}, sort_keys=False))
    return path


def test_waiver_moves_a_violation_and_expired_waiver_is_a_violation(tmp_path: Path, dev_data: dict[str, Any],
                                                                     write_env: Any) -> None:
    _inferred_placements(dev_data)
    ctx = context(write_env, dev_data)
    waiver = {"rule": "exact-mig-placements", "environment": "prod", "where": "pool a100-inference",
              "reason": "H200 placements confirmed by hand on node h200-01", "expires": "2027-01-31"}
    waivers, file = load_waivers(_waivers(tmp_path, [waiver]))
    report = evaluate(ctx, waivers, TODAY, file, rules=[RULES["exact-mig-placements"]])
    assert report.ok and report.violations == [] and len(report.waived) == 1
    late = evaluate(ctx, waivers, date(2027, 2, 1), file, rules=[RULES["exact-mig-placements"]])
    assert not late.ok
    assert {v.rule for v in late.violations} == {"waiver-expired", "exact-mig-placements"}
    expired = next(v for v in late.violations if v.rule == "waiver-expired")
    assert expired.where.endswith("waivers[0]") and "2027-01-31" in expired.message


@pytest.mark.parametrize(("item", "text"), [
    ({"rule": "exact-mig-placements", "environment": "prod", "expires": "2027-01-01"}, "reason"),
    ({"rule": "exact-mig-placements", "environment": "prod", "reason": "a good long reason"}, "expires"),
    ({"rule": "no-such-rule", "environment": "prod", "reason": "a good long reason", "expires": "2027-01-01"},
     "no rule named 'no-such-rule'"),
])
def test_bad_waivers_are_errors(tmp_path: Path, item: dict[str, Any], text: str) -> None:
    path = _waivers(tmp_path, [item])
    with pytest.raises(GpushareError) as info:
        load_waivers(path)
    assert any(text in str(p) for p in info.value.problems)
    assert info.value.problems[0].file == str(path)


@pytest.mark.parametrize(("mutate", "text"), [
    (lambda g: g["environments"]["prod"].__setitem__("max_oversubscriptoin", 2), "unknown key"),
    (lambda g: g["environments"]["prod"].__setitem__("max_oversubscription", 0.5), "greater than or equal to 1"),
    (lambda g: g["toolkit"].__setitem__("min_version", "1.17.0"), "below a listed fix"),
    (lambda g: g["environments"]["prod"]["max_shared_replicas"].pop("small"), "every memory class"),
    (lambda g: g["environments"]["prod"].__setitem__("promote_from", "staging"), "unknown environment"),
])
def test_bad_guardrails_are_errors(tmp_path: Path, mutate: Callable[[dict[str, Any]], None], text: str) -> None:
    data = yaml.safe_load((WORKSPACE / "policies" / "guardrails.yaml").read_text())
    mutate(data)
    path = tmp_path / "guardrails.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(GpushareError) as info:
        load_guardrails(path)
    assert any(text in str(p) for p in info.value.problems), [str(p) for p in info.value.problems]


def test_every_rule_is_documented() -> None:
    for r in RULES.values():
        assert r.id == r.id.lower() and " " not in r.id
        assert r.description and r.remediation and r.level in ("mandatory", "advisory")


def _plan(cluster: str, dcgm: bool = True, rule: bool = True, queues: dict[str, str] | None = None
          ) -> list[PlanResource]:
    plan = [PlanResource("kubernetes:helm.sh/v3:Release", f"{cluster}-gpu-operator",
                         {"chart": "gpu-operator", "values": {"dcgmExporter": {"enabled": dcgm}}}, cluster)]
    if rule:
        plan.append(PlanResource("kubernetes:monitoring.coreos.com/v1:PrometheusRule", f"{cluster}-rules", {}, cluster))
    for namespace, target in (queues or {}).items():
        plan.append(PlanResource("kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue", f"lq-{namespace}",
                                 {"metadata": {"name": "gpushare", "namespace": namespace},
                                  "spec": {"clusterQueue": target}}, cluster))
        plan.append(PlanResource("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue", f"cq-{target}",
                                 {"metadata": {"name": target}, "spec": {"cohortName": "gpushare"}}, cluster))
    return plan


def test_gpu_pools_monitored(dev_data: dict[str, Any], write_env: Any) -> None:
    ctx = context(write_env, dev_data, plan=_plan("dev-metal"))
    assert fired(ctx, "gpu-pools-monitored") == []
    ctx.plan = _plan("dev-metal", dcgm=False, rule=False)
    messages = [(v.where, v.message) for v in fired(ctx, "gpu-pools-monitored")]
    assert messages == [("cluster dev-metal", "dcgm-exporter is disabled in release dev-metal-gpu-operator"),
                        ("cluster dev-metal", "no gpushare PrometheusRule (GPU health and sharing alerts)")]


def test_tenant_has_queue(dev_data: dict[str, Any], write_env: Any) -> None:
    namespaces = {t["namespace"]: f"tenant-{t['name']}" for t in dev_data["tenants"]}
    ctx = context(write_env, dev_data, plan=_plan("dev-metal", queues=namespaces))
    assert fired(ctx, "tenant-has-queue") == []
    del namespaces["ds-notebooks"]
    ctx.plan = _plan("dev-metal", queues=namespaces)
    (v,) = fired(ctx, "tenant-has-queue")
    assert v.where == "tenant notebooks, cluster dev-metal" and "ds-notebooks has no Kueue LocalQueue" in v.message


def test_plan_rules_are_skipped_without_a_plan(dev_data: dict[str, Any], write_env: Any) -> None:
    report = evaluate(context(write_env, dev_data), [], TODAY)
    assert set(report.skipped) == {"gpu-pools-monitored", "tenant-has-queue"}


# ---------------------------------------------------------------- DRA clusters (docs/dra.md)

DRA_EXAMPLE = ROOT / "examples" / "environments" / "dra.yaml"
DRA_MONITORING = {"gpushare:monitoring": {"mode": "install", "release": "kube-prometheus-stack",
                                          "namespace": "monitoring"}}
UNTRUSTED_RULE = "untrusted-tenants-hardware-isolated"


@functools.cache
def _dra_plan() -> tuple[PlanResource, ...]:
    from gpushare.ops.preview import collect_plan

    plan = collect_plan("dra", {"gpushare:environment": str(DRA_EXAMPLE), **DRA_MONITORING})
    return tuple(PlanResource(r.type, r.name, r.inputs, plan.cluster_of(r)) for r in plan.resources)


def _dra_context(change: Callable[[list[PlanResource]], None] | None = None) -> Context:
    resources = list(_dra_plan())
    if change is not None:
        change(resources)
    return Context(fleet=resolve(DRA_EXAMPLE, PROFILES), guardrails=load_guardrails(), plan=resources)


def _template(namespace: str, device_class: str, shares: str | None = None) -> PlanResource:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    if shares is not None:
        exactly["capacity"] = {"requests": {"shares": shares}}
    return PlanResource("kubernetes:resource.k8s.io/v1:ResourceClaimTemplate", "extra", {
        "metadata": {"name": "extra", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}}, "lab-dra")


def test_the_dra_example_keeps_untrusted_tenants_isolated() -> None:
    assert RULES[UNTRUSTED_RULE].run(_dra_context()) == []


@pytest.mark.parametrize(("template", "text"), [
    (_template("partner-eval", "gpushare-notebooks-ts4"), "not a hardware-isolated gpushare class"),
    (_template("partner-eval", "gpu.nvidia.com"), "not a hardware-isolated gpushare class"),
    (_template("partner-eval", "gpushare-exclusive", "1"), "takes 1 of the 4 consumable shares"),
    (_template("partner-eval", "gpushare-exclusive"), "takes None of the 4 consumable shares"),
])
def test_untrusted_claim_templates_on_dra_clusters(template: PlanResource, text: str) -> None:
    violations = RULES[UNTRUSTED_RULE].run(_dra_context(lambda plan: plan.append(template)))
    assert [v.message for v in violations if text in v.message], violations


def test_a_trusted_tenants_shared_template_is_not_a_violation() -> None:
    context = _dra_context(lambda plan: plan.append(_template("ds-notebooks", "gpushare-notebooks-ts4")))
    assert RULES[UNTRUSTED_RULE].run(context) == []


def test_an_isolated_class_that_shares_its_device_is_a_violation() -> None:
    def share(plan: list[PlanResource]) -> None:
        for i, r in enumerate(plan):
            if r.type.endswith(":DeviceClass") and r.inputs["metadata"]["name"] == "gpushare-exclusive":
                spec = {**r.inputs["spec"], "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                    "sharing": {"strategy": "TimeSlicing"}}}}]}
                plan[i] = PlanResource(r.type, r.name, {**r.inputs, "spec": spec}, r.cluster)

    (violation,) = RULES[UNTRUSTED_RULE].run(_dra_context(share))
    assert violation.where == "DeviceClass gpushare-exclusive" and "TimeSlicing" in violation.message
