"""Guardrails that cannot be sidestepped: a frozen prod-like fleet (tests/guardrails/fixtures), mutated one way at a
time as an attacker or a hurried engineer would write it, each mutation failing with the rule that owns it; and the
controls beside them (exactly at a limit, a waiver expiring today, a toolkit exactly at the floor) still passing.

The plan comes from the real Pulumi program under the mock engine (gpushare.preview), as `gpushare check` and the
policy pack see it."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from datetime import date, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.errors import GpushareError
from gpushare.core.guardrails import Guardrails, load_guardrails
from gpushare.core.nvidia.operator import effective_device_list_strategy
from gpushare.core.resolve import resolve
from gpushare.ops.preview import collect_plan
from gpushare.policy.context import load_checked_guardrails
from gpushare.policy.evaluate import evaluate
from gpushare.policy.registry import Context, PlanResource, Violation
from gpushare.policy.rules import RULES
from gpushare.policy.waivers import Waiver, load_waivers
from gpushare.render.fleet import render_fleet

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PROD = FIXTURES / "environments" / "prod.yaml"
TODAY = date(2026, 11, 30)
# What Pulumi.prod.yaml says besides the environment file (frozen with the fixture).
STACK = {
    "gpushare:protect": True,
    "gpushare:monitoring": {"mode": "existing", "release": "kube-prometheus-stack", "namespace": "monitoring"},
    "gpushare:clusters": {"prod-gke": {"kubeconfigContext": "gke_gpushare-prod_europe-west4_prod-gke",
                                       "gke": {"project": "gpushare-prod", "location": "europe-west4",
                                               "cluster": "prod-gke"}}},
}
# Every rule but the promotion rule, which compares with the shipped pilot (users edit it; this fixture is frozen).
RULES_HERE = [r for r in RULES.values() if r.id != "promotion-from-pilot"]

Data = dict[str, Any]
Plan = list[PlanResource]


def prod_data() -> Data:
    return copy.deepcopy(yaml.safe_load(PROD.read_text()))


def write(tmp_path: Path, data: Data, name: str | None = None) -> Path:
    """The fleet as a workspace beside the frozen profiles: <tmp>/environments/<name>.yaml."""
    path = tmp_path / "environments" / f"{name or data['name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@cache
def _plan_of(env_file: str, operator_values: str | None) -> tuple[PlanResource, ...]:
    config: dict[str, Any] = {**STACK, "gpushare:environment": env_file}
    if operator_values is not None:
        config["gpushare:operatorValues"] = yaml.safe_load(operator_values)
    plan = collect_plan("prod", config, stack="prod")
    return tuple(PlanResource(r.type, r.name, r.inputs, plan.cluster_of(r)) for r in plan.resources)


def plan_of(env_file: Path, operator_values: dict[str, Any] | None = None) -> Plan:
    """A deep copy, so a test can mutate the plan it gets."""
    values = None if operator_values is None else yaml.safe_dump(operator_values)
    return copy.deepcopy(list(_plan_of(str(env_file), values)))


def context(env_file: Path, plan: Plan | None = None, guardrails: Guardrails | None = None,
            stack_config: dict[str, Any] | None = None, environment: str = "prod") -> Context:
    return Context(fleet=resolve(env_file, FIXTURES / "profiles"), guardrails=guardrails or load_guardrails(),
                   plan=plan, environment=environment, stack_config=stack_config)


def failing(ctx: Context, waivers: list[Waiver] | None = None, today: date = TODAY) -> list[Violation]:
    return evaluate(ctx, waivers or [], today, "waivers.yaml", rules=RULES_HERE).violations


def tenant(data: Data, name: str) -> Data:
    return next(t for t in data["tenants"] if t["name"] == name)


def pool(data: Data, name: str) -> Data:
    return next(p for p in data["pools"] if p["name"] == name)


@pytest.fixture(scope="module")
def clean_plan() -> Plan:
    return plan_of(PROD)


# ---------------------------------------------------------------- the fixture itself


def test_the_frozen_fixture_passes_every_rule_with_its_plan(clean_plan: Plan) -> None:
    report = evaluate(context(PROD, clean_plan, stack_config=STACK), [], TODAY, rules=RULES_HERE)
    assert report.violations == [] and report.skipped == [], [v.as_dict() for v in report.violations]


# ---------------------------------------------------------------- mutations: one way around a rule each


def _with_plan_values(mutate_values: Callable[[dict[str, Any]], None]) -> Callable[[Path], Context]:
    """A context whose plan's prod-metal GPU Operator release carries values changed after the program built them
    (a stack from another program version, or values edited by hand)."""
    def build(env_file: Path) -> Context:
        plan = plan_of(env_file)
        for i, r in enumerate(plan):
            if r.name == "prod-metal-nvidia-gpu-operator":
                values = copy.deepcopy(dict(r.inputs["values"]))
                mutate_values(values)
                plan[i] = replace(r, inputs={**r.inputs, "values": values})
        return context(env_file, plan)

    return build


def _plugin_args(*args: str) -> Callable[[dict[str, Any]], None]:
    return lambda v: v["devicePlugin"].__setitem__("args", list(args))


def _plugin_env(name: str, value: str) -> Callable[[dict[str, Any]], None]:
    def mutate(values: dict[str, Any]) -> None:
        values["devicePlugin"]["env"] = [e for e in values["devicePlugin"]["env"]
                                         if e["name"] != "DEVICE_LIST_STRATEGY"] + [{"name": name, "value": value}]

    return mutate


def _cdi_off_and_no_override(values: dict[str, Any]) -> None:
    # Left to the operator's asset env, the plugin runs with envvar.
    values["cdi"]["enabled"] = False
    values["devicePlugin"]["env"] = []


def _toolkit_image(tag: str) -> Callable[[Path], Context]:
    def build(env_file: Path) -> Context:
        daemonset = PlanResource("kubernetes:apps/v1:DaemonSet", "prod-metal-toolkit-installer", {
            "metadata": {"name": "toolkit-installer", "namespace": "gpu-operator"},
            "spec": {"template": {"spec": {"containers": [
                {"name": "toolkit", "image": f"registry.example:5000/nvidia/k8s/container-toolkit:{tag}"}]}}}},
            "prod-metal")
        return context(env_file, [*plan_of(env_file), daemonset])

    return build


def _rendered_toolkit(edit: Callable[[str], str]) -> Callable[[Path], Context]:
    def build(env_file: Path) -> Context:
        ctx = context(env_file)
        files = dict(render_fleet(ctx.fleet).files)
        files["nvidia-container-toolkit/config.toml"] = edit(files["nvidia-container-toolkit/config.toml"])
        ctx.rendered = files
        return ctx

    return build


def _plan_queue(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], Context]:
    """A context whose plan has the untrusted tenant's ClusterQueue changed."""
    def build(env_file: Path) -> Context:
        plan = plan_of(env_file)
        for i, r in enumerate(plan):
            if r.type.endswith(":ClusterQueue") and r.inputs["metadata"]["name"] == "tenant-partner-eval":
                inputs = copy.deepcopy(dict(r.inputs))
                edit(inputs)
                plan[i] = replace(r, inputs=inputs)
        return context(env_file, plan)

    return build


def _unlimited_borrowing_on(flavor: str) -> Callable[[dict[str, Any]], None]:
    def edit(queue: dict[str, Any]) -> None:
        for group in queue["spec"]["resourceGroups"]:
            for f in group["flavors"]:
                if f["name"] == flavor:
                    for entry in f["resources"]:
                        del entry["borrowingLimit"]  # left out, Kueue lets the queue borrow without limit

    return edit


def _borrow_shared(d: Data) -> None:
    # Quota 0 looks like nothing; the borrowing limit lets the tenant take idle time-sliced replicas.
    tenant(d, "partner-eval")["quota"]["nvidia.com/gpu.shared"] = 0
    tenant(d, "partner-eval")["borrowing_limit"] = {"nvidia.com/gpu.shared": 4}


def _untrusted_on_shared(d: Data) -> None:
    tenant(d, "partner-eval")["quota"]["nvidia.com/gpu.shared"] = 2


def _old_defaults(d: Data) -> None:
    d["defaults"]["toolkit_version"] = "1.18.1"


def _above_oversubscription(d: Data) -> None:
    # 32 more L40S shared 4 ways: (240 + 128) / (208 + 32) = 1.53, above prod's 1.5 and within dev's 4.0.
    pool(d, "l40s-notebooks")["hosts"] += [{"name": f"prod-l40s-{i:02d}", "address": f"10.60.3.{10 + i}",
                                            "gpu_count": 8} for i in range(3, 7)]


Build = Callable[[Path], Context]
MUTATIONS: list[tuple[str, str, Callable[[Data], None] | None, Build | None, str]] = [
    # (id, rule, data mutation, context builder, expected location)
    ("borrowing", "untrusted-tenants-hardware-isolated", _borrow_shared, None,
     "tenant partner-eval, borrowing_limit nvidia.com/gpu.shared"),
    ("untrusted-quota-shared", "untrusted-tenants-hardware-isolated", _untrusted_on_shared, None,
     "tenant partner-eval, quota nvidia.com/gpu.shared"),
    ("cohort-lending", "untrusted-tenants-hardware-isolated", None,
     _plan_queue(_unlimited_borrowing_on("l40s-notebooks")),
     "tenant partner-eval, ClusterQueue tenant-partner-eval, flavor l40s-notebooks"),
    ("toolkit-defaults", "toolkit-cve-floor", _old_defaults, None, "defaults.toolkit_version"),
    ("toolkit-operator-values-in-plan", "toolkit-cve-floor", None,
     lambda f: context(f, plan_of(f, {"toolkit": {"version": "v1.17.0-ubuntu20.04"}})),
     "release prod-metal-nvidia-gpu-operator, toolkit.version"),
    ("toolkit-operator-values-in-stack", "toolkit-cve-floor", None,
     lambda f: context(f, stack_config={**STACK, "gpushare:operatorValues": {"toolkit": {"version": "v1.17.8"}}}),
     "gpushare:operatorValues.toolkit.version"),
    ("toolkit-image-tag", "toolkit-cve-floor", None, _toolkit_image("v1.17.0-ubuntu20.04"),
     "DaemonSet prod-metal-toolkit-installer, image "
     "registry.example:5000/nvidia/k8s/container-toolkit:v1.17.0-ubuntu20.04"),
    ("toolkit-image-latest", "toolkit-cve-floor", None, _toolkit_image("latest"),
     "DaemonSet prod-metal-toolkit-installer, image registry.example:5000/nvidia/k8s/container-toolkit:latest"),
    ("device-list-args-equals", "device-list-strategy-not-envvar", None,
     _with_plan_values(_plugin_args("--device-list-strategy=envvar")), "release prod-metal-nvidia-gpu-operator"),
    ("device-list-args-two-items", "device-list-strategy-not-envvar", None,
     _with_plan_values(_plugin_args("--fail-on-init-error=false", "--device-list-strategy", "envvar")),
     "release prod-metal-nvidia-gpu-operator"),
    ("device-list-env-any-case", "device-list-strategy-not-envvar", None,
     _with_plan_values(_plugin_env("DEVICE_LIST_STRATEGY", "cdi-cri, EnvVar")),
     "release prod-metal-nvidia-gpu-operator"),
    ("device-list-env-name-lowercase", "device-list-strategy-not-envvar", None,
     _with_plan_values(lambda v: v["devicePlugin"]["env"].append({"name": "device_list_strategy", "value": "envvar"})),
     "release prod-metal-nvidia-gpu-operator, devicePlugin.env device_list_strategy"),
    ("device-list-cdi-off", "device-list-strategy-not-envvar", None,
     _with_plan_values(_cdi_off_and_no_override),
     "release prod-metal-nvidia-gpu-operator"),
    ("no-cgroups", "toolkit-hardened", None,
     _rendered_toolkit(lambda t: t.replace("no-cgroups = false", "no-cgroups = true")),
     "nvidia-container-toolkit/config.toml"),
    ("no-cgroups-missing", "toolkit-hardened", None,
     _rendered_toolkit(lambda t: t.replace("no-cgroups = false\n", "")), "nvidia-container-toolkit/config.toml"),
    ("ldconfig", "toolkit-hardened", None,
     _rendered_toolkit(lambda t: t.replace('ldconfig = "@/sbin/ldconfig"', 'ldconfig = "/sbin/ldconfig"')),
     "nvidia-container-toolkit/config.toml"),
    ("envvar-when-unprivileged", "toolkit-hardened", None,
     _rendered_toolkit(lambda t: t.replace("accept-nvidia-visible-devices-envvar-when-unprivileged = false",
                                           "accept-nvidia-visible-devices-envvar-when-unprivileged = true")),
     "nvidia-container-toolkit/config.toml"),
    ("oversubscription", "oversubscription-limit", _above_oversubscription, None, "environment prod"),
]


@pytest.mark.parametrize(("rule", "mutate", "build", "where"), [m[1:] for m in MUTATIONS],
                         ids=[m[0] for m in MUTATIONS])
def test_mutation_fails_with_its_rule(tmp_path: Path, rule: str, mutate: Callable[[Data], None] | None,
                                      build: Build | None, where: str) -> None:
    data = prod_data()
    if mutate is not None:
        mutate(data)
    env_file = write(tmp_path, data)
    ctx = (build or context)(env_file)
    violations = failing(ctx)
    mine = [v for v in violations if v.rule == rule]
    assert where in [v.where for v in mine], [v.as_dict() for v in violations]
    assert all(v.level == "mandatory" and v.fix and v.message for v in mine)


def test_at_least_fifteen_mutations() -> None:
    assert len(MUTATIONS) >= 15 and len({m[0] for m in MUTATIONS}) == len(MUTATIONS)


def test_the_untrusted_tenants_queue_borrows_nothing_shared_in_the_real_plan(clean_plan: Plan) -> None:
    (queue,) = [r for r in clean_plan if r.type.endswith(":ClusterQueue")
                and r.inputs["metadata"]["name"] == "tenant-partner-eval"]
    shared = [(f["name"], e) for g in queue.inputs["spec"]["resourceGroups"] for f in g["flavors"]
              for e in f["resources"] if f["name"] in ("l40s-notebooks", "gke-l4-inference")]
    assert shared and all(e["nominalQuota"] == 0 and e["borrowingLimit"] == 0 for _, e in shared)


def test_program_refuses_device_list_args_in_site_values(tmp_path: Path) -> None:
    """The program's own check reads args the same way, so `pulumi up` stops before the release exists."""
    env_file = write(tmp_path, prod_data())
    with pytest.raises(Exception, match="envvar"):
        plan_of(env_file, {"devicePlugin": {"args": ["--device-list-strategy", "envvar"]}})
    ctx = context(env_file, stack_config={**STACK, "gpushare:operatorValues": {
        "devicePlugin": {"args": ["-device-list-strategy=envvar"]}}})
    assert [v.where for v in failing(ctx) if v.rule == "device-list-strategy-not-envvar"] == [
        "gpushare:operatorValues"]


@pytest.mark.parametrize(("config", "values", "expected"), [
    ({"flags": {"plugin": {"deviceListStrategy": "envvar"}}}, None, ["envvar"]),
    ({"flags": {"plugin": {"deviceListStrategy": ["volume-mounts", "ENVVAR"]}}}, None, ["volume-mounts", "envvar"]),
    ({"flags": {"plugin": {"deviceListStrategy": "cdi-cri, envvar"}}}, None, ["cdi-cri", "envvar"]),
    ({}, {"cdi": {"enabled": False}}, ["envvar"]),  # the operator's asset env, not the config file
    ({"flags": {"plugin": {"deviceListStrategy": "volume-mounts"}}}, {"cdi": {"enabled": False}}, ["envvar"]),
    ({}, {"cdi": {"enabled": True}, "devicePlugin": {"args": ["--device-list-strategy volume-mounts"]}},
     ["volume-mounts"]),
    ({}, {"cdi": {"enabled": True}, "devicePlugin": {"args": ["--device-list-strategy=cdi-cri",
                                                                "--device-list-strategy=envvar"]}},
     ["cdi-cri", "envvar"]),
])
def test_every_spelling_of_the_strategy(config: dict[str, Any], values: dict[str, Any] | None,
                                        expected: list[str]) -> None:
    assert effective_device_list_strategy(config, values) == expected


# ---------------------------------------------------------------- environment identity


def test_a_file_whose_name_differs_from_its_file_name_is_refused(tmp_path: Path) -> None:
    data = prod_data()
    data["name"] = "dev"  # dev's limits for the prod fleet
    env_file = write(tmp_path, data, name="prod")
    with pytest.raises(GpushareError) as info:
        resolve(env_file, FIXTURES / "profiles")
    (problem,) = [p for p in info.value.problems if p.path == "name"]
    assert problem.file == str(env_file) and "'dev' differs from its file name 'prod.yaml'" in problem.message
    assert problem.fix == "rename the file to dev.yaml or set name: prod"
    result = CliRunner().invoke(app, ["check", "--env", str(env_file), "--no-plan", "--json"])
    assert result.exit_code == 1 and "differs from its file name" in result.output


def test_a_stack_loading_another_environment_is_judged_by_the_stack(tmp_path: Path) -> None:
    data = prod_data()
    data["name"] = "dev"
    _above_oversubscription(data)  # within dev's 4.0, above prod's 1.5
    ctx = context(write(tmp_path, data), environment="prod")
    wheres = {(v.rule, v.where) for v in failing(ctx)}
    assert ("environment-identity", "environment prod") in wheres
    assert ("oversubscription-limit", "environment prod") in wheres


# ---------------------------------------------------------------- waivers


def _waiver(rule: str, where: str, expires: date, environment: str = "prod") -> Waiver:
    return Waiver(rule=rule, environment=environment, where=where, reason="reviewed exception, ticket GPU-42",
                  expires=expires)


def _placements_violation(tmp_path: Path) -> Context:
    data = prod_data()
    pool(data, "a100-inference")["gpu_model"] = "NVIDIA A100 80GB PCIe"  # placements inferred, not from real output
    return context(write(tmp_path, data))


@pytest.mark.parametrize(("waiver", "text"), [
    (_waiver("exact-mig-placements", "*", TODAY + timedelta(days=30)), "matches everything"),
    (_waiver("exact-mig-placements", "[a-z]*", TODAY + timedelta(days=30)), "matches everything"),
    (_waiver("exact-mig-placements", "pool a100-inference", TODAY + timedelta(days=91)), "more than 90 days"),
    (_waiver("exact-mig-placements", "pool a100-inference", date(2036, 11, 30)), "more than 90 days"),
    (_waiver("exact-mig-placements", "pool *", TODAY + timedelta(days=30)), "matches 18 objects"),
    (_waiver("exact-mig-placements", "pool a100-inference*", TODAY + timedelta(days=30)), "matches 5 objects"),
], ids=["star", "class-star", "91-days", "ten-years", "every-pool", "pool-and-its-hosts"])
def test_refused_waiver_is_a_violation_and_waives_nothing(tmp_path: Path, waiver: Waiver, text: str) -> None:
    violations = failing(_placements_violation(tmp_path), [waiver])
    (refused,) = [v for v in violations if v.rule == "waiver-refused"]
    assert refused.where == "waivers.yaml: waivers[0]" and text in refused.message and refused.fix
    assert "exact-mig-placements" in {v.rule for v in violations}


def test_non_waivable_rule_in_prod(tmp_path: Path) -> None:
    data = prod_data()
    _old_defaults(data)
    ctx = context(write(tmp_path, data))
    violations = failing(ctx, [_waiver("toolkit-cve-floor", "defaults.toolkit_version", TODAY + timedelta(days=7))])
    (refused,) = [v for v in violations if v.rule == "waiver-refused"]
    assert "toolkit-cve-floor cannot be waived in prod" in refused.message
    assert "toolkit-cve-floor" in {v.rule for v in violations}
    assert set(load_guardrails().environment("prod").non_waivable) == {
        "untrusted-tenants-hardware-isolated", "toolkit-cve-floor"}


# ---------------------------------------------------------------- controls: what must still pass


def _exactly_at_the_limit(d: Data) -> None:
    # 5 x 8 whole H100s and 2 x 4 L40S shared 4 ways: (40 + 32) / (40 + 8) = 1.5, prod's limit.
    training = pool(d, "h100-training")
    training["hosts"].append({"name": "prod-h100-07", "address": "10.60.2.17", "gpu_count": 8, "nvswitch": True})
    d["pools"] = [training, pool(d, "l40s-notebooks")]
    d["tenants"] = [tenant(d, "research"), tenant(d, "notebooks")]


def test_exactly_at_the_oversubscription_limit_passes(tmp_path: Path) -> None:
    data = prod_data()
    _exactly_at_the_limit(data)
    ctx = context(write(tmp_path, data))
    assert ctx.fleet.totals.oversubscription == ctx.limits.max_oversubscription == 1.5
    assert RULES["oversubscription-limit"].run(ctx) == []
    pool(data, "l40s-notebooks")["hosts"][0]["gpu_count"] = 5
    assert [v.where for v in RULES["oversubscription-limit"].run(context(write(tmp_path, data)))] == [
        "environment prod"]


@pytest.mark.parametrize("expires", [TODAY, TODAY + timedelta(days=90)], ids=["today", "in-90-days"])
def test_waiver_expiring_today_or_at_the_longest_is_accepted(tmp_path: Path, expires: date) -> None:
    ctx = _placements_violation(tmp_path)
    report = evaluate(ctx, [_waiver("exact-mig-placements", "pool a100-inference", expires)], TODAY, "waivers.yaml",
                      rules=RULES_HERE)
    assert report.violations == [] and [v.rule for v, _ in report.waived] == ["exact-mig-placements"]
    tomorrow = evaluate(ctx, [_waiver("exact-mig-placements", "pool a100-inference", TODAY)],
                        TODAY + timedelta(days=1), "waivers.yaml", rules=RULES_HERE)
    assert {v.rule for v in tomorrow.violations} == {"waiver-expired", "exact-mig-placements"}


def test_toolkit_exactly_at_the_floor_passes_in_every_source(tmp_path: Path) -> None:
    floor = load_guardrails().toolkit.min_version
    data = prod_data()
    data["defaults"]["toolkit_version"] = floor
    env_file = write(tmp_path, data)
    ctx = _toolkit_image(f"v{floor}-ubuntu20.04")(env_file)
    ctx.plan = [*(ctx.plan or []), *plan_of(env_file, {"toolkit": {"version": f"v{floor}-ubi8"}})]
    ctx.stack_config = {**STACK, "gpushare:operatorValues": {"toolkit": {"version": floor}}}
    assert RULES["toolkit-cve-floor"].run(ctx) == []


# ---------------------------------------------------------------- the waivers file


def _waivers_file(tmp_path: Path, items: list[dict[str, Any]]) -> Path:
    path = tmp_path / "waivers.yaml"
    path.write_text(yaml.safe_dump({"waivers": items}, sort_keys=False))
    return path


def test_missing_waivers_file_given_explicitly_exits_2(tmp_path: Path) -> None:
    with pytest.raises(GpushareError) as info:
        load_waivers(tmp_path / "nope.yaml")
    assert info.value.exit_code == 2 and "leave --waivers out" in str(info.value.problems[0].fix)
    result = CliRunner().invoke(app, ["check", "--env", str(write(tmp_path, prod_data())), "--no-plan",
                                      "--waivers", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "waivers file not found" in result.output


@pytest.mark.parametrize("expires", ["2020-01-01", "2027-01-01"], ids=["expired", "current"])
def test_waiver_for_an_unknown_environment_is_an_error(tmp_path: Path, expires: str) -> None:
    path = _waivers_file(tmp_path, [{"rule": "exact-mig-placements", "environment": "prdo", "where": "pool a",
                                     "reason": "a good long reason", "expires": expires}])
    with pytest.raises(GpushareError) as info:
        load_waivers(path)
    (problem,) = info.value.problems
    assert problem.file == str(path) and problem.path == "waivers[0].environment"
    assert "'prdo'" in problem.message and "prod" in str(problem.fix)


def test_waiver_needs_an_explicit_where(tmp_path: Path) -> None:
    path = _waivers_file(tmp_path, [{"rule": "exact-mig-placements", "environment": "prod",
                                     "reason": "a good long reason", "expires": "2027-01-01"}])
    with pytest.raises(GpushareError) as info:
        load_waivers(path)
    assert any(p.path == "waivers[0].where" for p in info.value.problems)


# ---------------------------------------------------------------- the guardrails file


def _guardrails_with(tmp_path: Path, mutate: Callable[[dict[str, Any]], None], name: str = "guardrails.yaml"
                     ) -> Path:
    """The shipped guardrails, changed (load_guardrails caches by path: each variant gets its own name)."""
    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "policies" / "guardrails.yaml").read_text())
    mutate(data)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("mutate", "text"), [
    (lambda g: g["environments"]["prod"].__setitem__("non_waivable", ["toolkit-cve-flor"]), "unknown rule"),
    (lambda g: g["toolkit"]["hardened"].__setitem__("nvidia-container-cli.ldconfig", {"prefx": "@"}), "prefx"),
    (lambda g: g["toolkit"]["hardened"].__setitem__("nvidia container cli", False), "should match pattern"),
    (lambda g: g.__setitem__("max_waiver_days", 0), "greater than or equal to 1"),
])
def test_bad_guardrail_settings_are_errors(tmp_path: Path, mutate: Callable[[dict[str, Any]], None],
                                           text: str) -> None:
    with pytest.raises(GpushareError) as info:
        load_checked_guardrails(_guardrails_with(tmp_path, mutate))
    assert any(text in str(p) for p in info.value.problems), [str(p) for p in info.value.problems]


def test_hardened_settings_apply_as_listed(tmp_path: Path) -> None:
    """A setting added to guardrails.yaml is enforced on the rendered file without code changes."""
    path = _guardrails_with(tmp_path, lambda g: g["toolkit"]["hardened"].__setitem__(
        "nvidia-container-runtime.modes.cdi.default-kind", {"prefix": "nvidia.com/"}))
    ctx = context(write(tmp_path, prod_data()), guardrails=load_guardrails(path))
    assert RULES["toolkit-hardened"].run(ctx) == []
    path = _guardrails_with(tmp_path, lambda g: g["toolkit"]["hardened"].__setitem__(
        "nvidia-container-runtime.disable-it", True), "missing.yaml")
    ctx = context(write(tmp_path, prod_data()), guardrails=load_guardrails(path))
    (v,) = RULES["toolkit-hardened"].run(ctx)
    assert v.message == "nvidia-container-runtime.disable-it is missing; it must be true"
