"""A pull request cannot weaken a guardrail by how it spells a change (issue 26, the contributor's side): each class
of attack is refused with a located error and a fix, and its legitimate neighbour still passes. Where each class is
enforced: docs/guardrails.md, "Threat model: contributors"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.guardrails import load_guardrails
from gpushare.core.reading import parse_yaml
from gpushare.core.resolve import resolve
from gpushare.core.spec import address_key, load_profile_file, version_tuple
from gpushare.policy.waivers import load_waivers
from tests.conftest import ENVIRONMENTS, PROFILES, WORKSPACE, host_named, pool_named, tenant_named

pytestmark = pytest.mark.usefixtures("frozen_workspace")  # GPUSHARE_ROOT: the frozen workspace, as in tests/unit

DEV_TEXT = (ENVIRONMENTS / "dev.yaml").read_text()
GUARDRAILS = WORKSPACE / "policies" / "guardrails.yaml"


def problems_of(action: Callable[[], object]) -> list[Problem]:
    with pytest.raises(GpushareError) as info:
        action()
    assert info.value.exit_code == 1
    return info.value.problems


def only(problems: list[Problem]) -> Problem:
    assert len(problems) == 1, [str(p) for p in problems]
    return problems[0]


def env_file(tmp_path: Path, text: str, name: str = "dev") -> Path:
    path = tmp_path / "environments" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def dev_with(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    data = yaml.safe_load(DEV_TEXT)
    change(data)
    return env_file(tmp_path, yaml.safe_dump(data, sort_keys=False))


# ---------------------------------------------------------------- YAML merge keys

# partner-eval is untrusted; a merge key copies the trusted tenant's entry into it, so the diff shows no `trust:` line.
MERGED_TRUST = DEV_TEXT.replace("  - name: research\n", "  - &trusted_batch\n    name: research\n").replace(
    "  - name: partner-eval\n    namespace: partner-eval\n    trust: untrusted\n    priority: batch\n",
    "  - <<: *trusted_batch\n    name: partner-eval\n    namespace: partner-eval\n")


def test_a_merge_key_that_changes_a_tenants_trust_is_refused(tmp_path: Path) -> None:
    assert MERGED_TRUST != DEV_TEXT and "<<: *trusted_batch" in MERGED_TRUST
    # Plain YAML would make the untrusted tenant trusted without a line saying so.
    assert tenant_named(yaml.safe_load(MERGED_TRUST), "partner-eval")["trust"] == "trusted"
    path = env_file(tmp_path, MERGED_TRUST)
    problem = only(problems_of(lambda: resolve(path, PROFILES)))
    assert "merge key" in problem.message and problem.file == str(path) and problem.fix
    assert problem.line == MERGED_TRUST.splitlines().index("  - <<: *trusted_batch") + 1


def test_anchors_and_aliases_of_whole_values_stay_allowed(tmp_path: Path) -> None:
    # The neighbour: an alias stands on the line it changes (`taints: *pool_taints`), so a review sees it.
    text = DEV_TEXT.replace("    taints:\n      - {key: gpushare.io/pool, value: a100-inference, effect: NoSchedule}",
                            "    taints: &a100_taints\n      - {key: gpushare.io/pool, value: a100-inference, "
                            "effect: NoSchedule}", 1).replace(
        "    profile: notebooks-ts4\n", "    profile: notebooks-ts4\n    taints: *a100_taints\n", 1)
    assert "taints: *a100_taints" in text
    fleet = resolve(env_file(tmp_path, text), PROFILES)
    (a100_taint,) = [t for t in fleet.pool("a100-inference").nodes[0].taints if t.value == "a100-inference"]
    assert a100_taint in fleet.pool("l4-notebooks").nodes[0].taints


@pytest.mark.parametrize("kind", ["guardrails", "waivers", "profile"])
def test_merge_keys_are_refused_in_every_workspace_file(tmp_path: Path, kind: str) -> None:
    if kind == "guardrails":
        text = GUARDRAILS.read_text()
        prod = text.index("  prod:\n")
        text = text[:prod] + "  staging:\n    <<: *never_used\n" + text[prod:]
        path = tmp_path / "guardrails.yaml"
        path.write_text(text.replace("environments:\n", "base: &never_used {}\nenvironments:\n", 1))
        problem = only(problems_of(lambda: load_guardrails(path)))
    elif kind == "waivers":
        path = tmp_path / "waivers.yaml"
        path.write_text("base: &w {rule: toolkit-cve-floor, environment: dev}\n"
                        "waivers:\n  - <<: *w\n    where: pool a100-inference\n    reason: a reason long enough\n"
                        "    expires: 2026-01-01\n")
        problem = only(problems_of(lambda: load_waivers(path, load_guardrails(GUARDRAILS))))
    else:
        source = (PROFILES / "notebooks-ts4.yaml").read_text()
        path = tmp_path / "notebooks-ts4.yaml"
        path.write_text(source.replace("time_slicing:\n", "time_slicing: &ts\n", 1) + "shadow:\n  <<: *ts\n")
        problem = only(problems_of(lambda: load_profile_file(path)))
    assert "merge key" in problem.message and problem.file == str(path) and problem.line and problem.fix


def test_a_quoted_double_angle_key_is_only_an_unknown_key() -> None:
    # The neighbour: '<<' quoted is an ordinary key, left to the model (which refuses unknown keys).
    assert parse_yaml("a: {'<<': 1}\n", "x.yaml") == {"a": {"<<": 1}}


# ---------------------------------------------------------------- one reading of versions and numbers

ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")


@pytest.mark.parametrize(("field", "change"), [
    ("defaults.toolkit_version", lambda d: d["defaults"].update(toolkit_version="1.18.2".translate(ARABIC_INDIC))),
    ("defaults.containerd_version", lambda d: d["defaults"].update(containerd_version="2.١")),
    ("clusters[0].kubernetes_version", lambda d: d["clusters"][0].update(kubernetes_version="1.٣٣")),
    ("pools[2].hosts[0].containerd_version",
     lambda d: pool_named(d, "l4-notebooks")["hosts"][0].update(containerd_version="２.1")),  # fullwidth 2
])
def test_versions_with_digits_of_other_scripts_are_refused(tmp_path: Path, field: str,
                                                           change: Callable[[dict[str, Any]], None]) -> None:
    # Python's int() reads these as 1.18.2 and 1.33, while every tool the value reaches sees another string.
    problem = only(problems_of(lambda: resolve(dev_with(tmp_path, change), PROFILES)))
    assert problem.path == field and problem.fix and "the digits 0-9" in problem.fix


def test_ascii_versions_still_read_as_before(tmp_path: Path) -> None:
    fleet = resolve(dev_with(tmp_path, lambda d: d["defaults"].update(toolkit_version="1.18.3")), PROFILES)
    assert fleet.nodes[0].toolkit_version == "1.18.3"
    assert version_tuple("1.18.3") == (1, 18, 3) and version_tuple("1.١٨.3") == (1, 3)


def test_a_guardrail_floor_with_other_digits_is_refused(tmp_path: Path) -> None:
    text = GUARDRAILS.read_text()
    floor = load_guardrails(GUARDRAILS).toolkit.min_version
    assert f'min_version: "{floor}"' in text
    path = tmp_path / "guardrails.yaml"
    path.write_text(text.replace(f'min_version: "{floor}"', f'min_version: "{floor.translate(ARABIC_INDIC)}"'))
    problem = only(problems_of(lambda: load_guardrails(path)))
    assert problem.path == "toolkit.min_version" and problem.line


def test_a_mig_count_with_other_digits_is_not_a_number() -> None:
    from gpushare.core.mig import parse_layout

    with pytest.raises(GpushareError, match="not a whole number"):
        parse_layout("1g.10gb=٢")
    assert parse_layout("1g.10gb=2")


# ---------------------------------------------------------------- management addresses


def test_an_ipv4_mapped_address_cannot_put_one_machine_in_two_pools(tmp_path: Path) -> None:
    path = dev_with(tmp_path, lambda d: host_named(d, "dev-l4-01").update(address="::ffff:10.40.2.11"))
    problem = only(problems_of(lambda: resolve(path, PROFILES)))
    assert problem.path == "pools[2].hosts[0].address"
    assert "also host 'dev-h100-01'" in problem.message and "the same machine" in problem.message


@pytest.mark.parametrize("spelling", ["::FFFF:10.40.2.11", "0:0:0:0:0:ffff:a28:20b"])
def test_every_spelling_of_one_address_is_one_machine(spelling: str) -> None:
    assert address_key(spelling) == address_key("10.40.2.11") == "10.40.2.11"
    assert address_key("2001:DB8:0::1") == address_key("2001:db8::1")
    assert address_key("gpu-01.example.net") == "gpu-01.example.net"


def test_a_mapped_address_of_its_own_machine_is_allowed(tmp_path: Path) -> None:
    fleet = resolve(dev_with(tmp_path, lambda d: host_named(d, "dev-l4-01").update(address="::ffff:10.40.3.11")),
                    PROFILES)
    assert fleet.pool("l4-notebooks").nodes[0].address == "::ffff:10.40.3.11"


@pytest.mark.parametrize(("address", "why"), [
    ("127.0.0.1", "loopback"), ("127.10.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
    ("0.0.0.0", "unspecified"), ("0.1.2.3", "unspecified"), ("::", "unspecified"),
    ("169.254.169.254", "link-local"), ("fe80::1%eth0", "link-local"),
    ("224.0.0.1", "multicast"), ("255.255.255.255", "broadcast"), ("::10.40.3.11", "IPv4-compatible"),
    ("localhost", "localhost"), ("gpu.localhost", "localhost"),
])
def test_addresses_that_can_only_be_the_controller_are_refused(tmp_path: Path, address: str, why: str) -> None:
    path = dev_with(tmp_path, lambda d: host_named(d, "dev-l4-01").update(address=address))
    problem = only(problems_of(lambda: resolve(path, PROFILES)))
    assert problem.path == "pools[2].hosts[0].address" and why in problem.message and problem.fix


@pytest.mark.parametrize("address", ["10.40.3.12", "192.0.2.7", "2001:db8::7", "fd00::7", "gpu-07.example.net"])
def test_routable_and_private_addresses_stay_allowed(tmp_path: Path, address: str) -> None:
    fleet = resolve(dev_with(tmp_path, lambda d: host_named(d, "dev-l4-01").update(address=address)), PROFILES)
    assert fleet.pool("l4-notebooks").nodes[0].address == address


def test_an_address_of_other_scripts_digits_is_no_address(tmp_path: Path) -> None:
    path = dev_with(tmp_path, lambda d: host_named(d, "dev-l4-01").update(address="10.40.3.11".translate(
        ARABIC_INDIC)))
    problem = only(problems_of(lambda: resolve(path, PROFILES)))
    assert problem.path == "pools[2].hosts[0].address"


# ---------------------------------------------------------------- files outside the workspace


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the frozen workspace (marker, environments, profiles, policies, stacks), as GPUSHARE_ROOT."""
    import shutil

    root = tmp_path / "ws"
    shutil.copytree(WORKSPACE, root)
    monkeypatch.setenv("GPUSHARE_ROOT", str(root))
    return root


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A folder outside the workspace, holding an environment and a profile a reviewer never sees."""
    import shutil

    folder = tmp_path / "elsewhere"
    folder.mkdir()
    shutil.copy(ENVIRONMENTS / "dev.yaml", folder / "dev.yaml")
    shutil.copy(PROFILES / "notebooks-ts4.yaml", folder / "notebooks-ts4.yaml")
    return folder


def link(path: Path, target: Path) -> Path:
    """Replace a file (or an empty spot) with a symbolic link to target."""
    path.unlink(missing_ok=True)
    path.symlink_to(target)
    return path


def test_an_environment_file_linked_out_of_the_workspace_is_refused(workspace: Path, elsewhere: Path) -> None:
    env = link(workspace / "environments" / "dev.yaml", elsewhere / "dev.yaml")
    problem = only(problems_of(lambda: resolve(env)))
    assert problem.file == str(env) and "outside the workspace" in problem.message
    assert str(elsewhere / "dev.yaml") in problem.message and "cp --remove-destination" in (problem.fix or "")


def test_a_folder_linked_out_of_the_workspace_is_refused_too(workspace: Path, elsewhere: Path) -> None:
    import shutil

    shutil.rmtree(workspace / "environments")
    link(workspace / "environments", elsewhere)
    problem = only(problems_of(lambda: resolve(workspace / "environments" / "dev.yaml")))
    assert "outside the workspace" in problem.message


def test_a_profile_linked_out_of_the_workspace_is_refused(workspace: Path, elsewhere: Path) -> None:
    profile = link(workspace / "profiles" / "notebooks-ts4.yaml", elsewhere / "notebooks-ts4.yaml")
    problem = only(problems_of(lambda: resolve(workspace / "environments" / "dev.yaml")))
    assert problem.file == str(profile) and "profile file" in problem.message


def test_a_guardrails_file_linked_out_of_the_workspace_is_refused(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "guardrails.yaml"
    outside.write_text(GUARDRAILS.read_text())
    path = link(workspace / "policies" / "guardrails.yaml", outside)
    problem = only(problems_of(lambda: load_guardrails(path)))
    assert problem.file == str(path) and "outside the workspace" in problem.message


def test_links_inside_the_workspace_stay_allowed(workspace: Path) -> None:
    # The neighbour: this checkout links profiles/ and policies/guardrails.yaml into the package, inside the repository.
    import shutil

    shutil.move(workspace / "profiles", workspace / "shared-profiles")
    link(workspace / "profiles", workspace / "shared-profiles")
    (workspace / "environments" / "current").mkdir()
    shutil.move(workspace / "environments" / "dev.yaml", workspace / "environments" / "current" / "dev.yaml")
    link(workspace / "environments" / "dev.yaml", Path("current") / "dev.yaml")
    assert resolve(workspace / "environments" / "dev.yaml").environment == "dev"


def test_a_file_named_outside_every_workspace_is_read_as_given(elsewhere: Path) -> None:
    # `--env /some/path.yaml` is the caller's choice, not a file a pull request slipped in.
    assert resolve(elsewhere / "dev.yaml", PROFILES).environment == "dev"


def stack_with(workspace: Path, environment: str, name: str = "dev") -> Path:
    stack = workspace / f"Pulumi.{name}.yaml"
    data = yaml.safe_load(stack.read_text())
    data["config"]["gpushare:environment"] = environment
    stack.write_text(yaml.safe_dump(data))
    return stack


@pytest.mark.parametrize("spelling", ["../elsewhere/dev.yaml", "{elsewhere}/dev.yaml",
                                      "environments/../../elsewhere/dev.yaml"])
def test_a_stack_that_deploys_a_file_outside_the_workspace_is_refused(workspace: Path, elsewhere: Path,
                                                                      spelling: str) -> None:
    from gpushare.core.stacks import stack_config

    stack = stack_with(workspace, spelling.format(elsewhere=elsewhere))
    problem = only(problems_of(lambda: stack_config("dev")))
    assert problem.file == str(stack) and problem.path == "gpushare:environment"
    assert "outside the workspace" in problem.message and "environments/dev.yaml" in (problem.fix or "")


def test_a_stack_whose_environment_is_linked_out_of_the_workspace_is_refused(workspace: Path, elsewhere: Path
                                                                             ) -> None:
    from gpushare.core.stacks import stack_config

    link(workspace / "environments" / "dev.yaml", elsewhere / "dev.yaml")
    problem = only(problems_of(lambda: stack_config("dev")))
    assert problem.path == "gpushare:environment" and "through a symbolic link" in problem.message


def test_check_judges_the_file_the_stack_deploys(workspace: Path) -> None:
    import shutil

    from gpushare.policy.context import context_for
    from gpushare.policy.rules import RULES

    identity = RULES["environment-identity"]
    assert identity.run(context_for("dev")) == []  # the neighbour: the stack deploys environments/dev.yaml
    # Inside the workspace, named dev, but not the file `check --env dev` judges.
    (workspace / "environments" / "next").mkdir()
    shutil.copy(workspace / "environments" / "dev.yaml", workspace / "environments" / "next" / "dev.yaml")
    stack_with(workspace, "environments/next/dev.yaml")
    (violation,) = identity.run(context_for("dev"))
    assert "deploys" in violation.message and "environments/next/dev.yaml" in violation.message


def test_the_program_refuses_a_stack_environment_that_climbs_out(workspace: Path, elsewhere: Path) -> None:
    from gpushare.ops.preview import collect_plan

    config = yaml.safe_load((workspace / "Pulumi.dev.yaml").read_text())["config"]
    with pytest.raises(GpushareError, match="outside the workspace"):
        collect_plan("dev", {**config, "gpushare:environment": "../elsewhere/dev.yaml"})


# ---------------------------------------------------------------- lifting a rule from non_waivable and waiving it


def git(root: Path, *args: str) -> str:
    import subprocess

    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.net", *args],
                          check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repository(workspace: Path) -> Path:
    """The workspace as a Git repository with one commit: the base branch a change is judged against."""
    git(workspace, "init", "-q", "-b", "main")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-q", "-m", "base")
    return workspace


WAIVER = {"rule": "toolkit-cve-floor", "environment": "prod", "where": "defaults.toolkit_version",
          "reason": "the vendor image is rebuilt next week", "expires": "2026-01-20"}


def lift(root: Path, rule: str = "toolkit-cve-floor") -> None:
    path = root / "policies" / "guardrails.yaml"
    text = path.read_text()
    old = "non_waivable: [untrusted-tenants-hardware-isolated, toolkit-cve-floor]"
    assert old in text
    kept = [r for r in ("untrusted-tenants-hardware-isolated", "toolkit-cve-floor") if r != rule]
    path.write_text(text.replace(old, f"non_waivable: [{', '.join(kept)}]"))


def check(root: Path, *args: str) -> tuple[int, dict[str, Any]]:
    import json

    from typer.testing import CliRunner

    from gpushare.cli import app

    waivers = root / "policies" / "waivers.yaml"
    waivers.write_text(yaml.safe_dump({"waivers": [WAIVER]}))
    result = CliRunner().invoke(app, ["check", "--env", "prod", "--no-plan", "--json", "--today", "2026-01-01",
                                      "--waivers", str(waivers), *args], env={"GPUSHARE_ROOT": str(root)})
    return result.exit_code, json.loads(result.stdout)


def refusals(report: dict[str, Any]) -> list[dict[str, str]]:
    return [v for v in report.get("violations", []) if v["rule"] == "waiver-refused"]


def test_a_change_that_lifts_a_rule_from_non_waivable_and_waives_it_is_refused(repository: Path) -> None:
    lift(repository)
    code, report = check(repository, "--base", "main")
    (refused,) = refusals(report)
    assert code == 1 and "non-waivable in prod at main" in refused["message"]
    assert "lifts it from non_waivable and waives it at once" in refused["message"] and "merged" in refused["fix"]


def test_the_waiver_may_follow_once_the_lift_has_merged(repository: Path) -> None:
    lift(repository)
    (repository / "policies" / "waivers.yaml").unlink(missing_ok=True)
    git(repository, "commit", "-q", "-am", "lift toolkit-cve-floor in prod, reviewed on its own")
    # The neighbour: the waiver, in a change of its own after the lift merged, is judged by today's list.
    code, report = check(repository, "--base", "main")
    assert refusals(report) == [], report


def test_a_waiver_of_a_rule_non_waivable_now_is_refused_with_or_without_a_base(repository: Path) -> None:
    for args in ((), ("--base", "main")):
        _, report = check(repository, *args)
        (refused,) = refusals(report)
        assert "cannot be waived in prod" in refused["message"]


def test_other_lifts_do_not_refuse_this_waiver(repository: Path) -> None:
    # Lifting another rule says nothing about toolkit-cve-floor: still refused only as non-waivable now.
    lift(repository, "untrusted-tenants-hardware-isolated")
    _, report = check(repository, "--base", "main")
    (refused,) = refusals(report)
    assert "cannot be waived in prod (" in refused["message"]


@pytest.mark.parametrize(("base", "text"), [("no-such-branch", "names no commit"), ("--all", "not a Git revision")])
def test_a_base_that_is_no_commit_is_a_clear_error(repository: Path, base: str, text: str) -> None:
    code, report = check(repository, "--base", base)
    assert code == 2 and text in report["errors"][0] and report["problems"][0]["fix"]


def test_the_base_guardrails_are_read_through_links_in_the_tree(repository: Path) -> None:
    # As in this checkout, where policies/guardrails.yaml links into the package.
    import shutil

    from gpushare.core.guardrails import non_waivable_at

    policies = repository / "policies"
    shutil.move(policies / "guardrails.yaml", repository / "shared-guardrails.yaml")
    link(policies / "guardrails.yaml", Path("..") / "shared-guardrails.yaml")
    git(repository, "add", "-A")
    git(repository, "commit", "-q", "-m", "link")
    assert non_waivable_at("main", "prod", policies / "guardrails.yaml") == (
        "untrusted-tenants-hardware-isolated", "toolkit-cve-floor")
    assert non_waivable_at("main", "dev", policies / "guardrails.yaml") == ()


# ---------------------------------------------------------------- the deployer identity


def deployer_violations(deployer: dict[str, Any] | None) -> list[str]:
    from gpushare.policy.registry import Context
    from gpushare.policy.rules import RULES

    config = {} if deployer is None else {"gpushare:deployer": deployer}
    ctx = Context(fleet=resolve(ENVIRONMENTS / "dev.yaml", PROFILES), guardrails=load_guardrails(GUARDRAILS),
                  environment="dev", stack_config=config)
    return [f"{v.where}: {v.message}" for v in RULES["deployer-identity-narrow"].run(ctx)]


@pytest.mark.parametrize(("deployer", "where"), [
    ({"groups": ["system:authenticated"]}, "gpushare:deployer.groups[0]"),
    ({"groups": ["system:masters", "system:serviceaccounts"]}, "gpushare:deployer.groups[1]"),
    ({"groups": ["system:serviceaccounts:partner-eval"]}, "gpushare:deployer.groups[0]"),
    ({"groups": ["system:nodes"]}, "gpushare:deployer.groups[0]"),
    ({"users": ["system:serviceaccount:partner-eval:default"], "groups": []}, "gpushare:deployer.users[0]"),
    ({"users": ["system:anonymous"]}, "gpushare:deployer.users[0]"),
    ({"users": ["system:node:dev-l4-01"], "groups": []}, "gpushare:deployer.users[0]"),
])
def test_a_deployer_that_is_a_broad_group_or_a_tenant_account_is_refused(deployer: dict[str, Any], where: str
                                                                         ) -> None:
    (violation,) = deployer_violations(deployer)
    assert violation.startswith(where + ": ")


@pytest.mark.parametrize("deployer", [
    None, {"groups": ["system:masters"]}, {"users": ["system:serviceaccount:gpushare-ci:deployer"], "groups": []},
    {"users": ["ci-deployer@example.iam.gserviceaccount.com"], "groups": ["platform-deployers"]},
    '{"users": ["system:serviceaccount:gpushare-ci:deployer"], "groups": []}',  # Pulumi's JSON text form
])
def test_gpushares_own_deployer_is_allowed(deployer: Any) -> None:
    assert deployer_violations(deployer) == []


def test_the_program_refuses_a_deployer_that_is_a_tenant_account() -> None:
    from gpushare.ops.preview import collect_plan

    config = yaml.safe_load((WORKSPACE / "Pulumi.dev.yaml").read_text())["config"]
    deployer = {"users": ["system:serviceaccount:ds-notebooks:builder"], "groups": []}
    with pytest.raises(GpushareError) as info:
        collect_plan("dev", {**config, "gpushare:deployer": deployer})
    problem = only(info.value.problems)
    assert problem.path == "gpushare:deployer.users[0]" and "ds-notebooks" in problem.message and problem.fix


# ---------------------------------------------------------------- operator values that rename the advertised GPUs

RENAMES = "operator-values-keep-resource-names"


def renaming(site: dict[str, Any] | None = None, plan: list[Any] | None = None) -> list[str]:
    from gpushare.policy.registry import Context
    from gpushare.policy.rules import RULES

    config = {} if site is None else {"gpushare:operatorValues": site}
    ctx = Context(fleet=resolve(ENVIRONMENTS / "dev.yaml", PROFILES), guardrails=load_guardrails(GUARDRAILS),
                  environment="dev", stack_config=config, plan=plan)
    return [f"{v.where}: {v.message}" for v in RULES[RENAMES].run(ctx)]


@pytest.mark.parametrize(("site", "where"), [
    ({"devicePlugin": {"args": ["--mig-strategy=single"]}}, "devicePlugin.args"),
    ({"devicePlugin": {"args": ["-mig-strategy", "single"]}}, "devicePlugin.args"),
    ({"devicePlugin": {"args": ["--config-file /etc/other/config.yaml"]}}, "devicePlugin.args"),
    ({"devicePlugin": {"env": [{"name": "mig-strategy", "value": "single"}]}}, "devicePlugin.env mig-strategy"),
    ({"devicePlugin": {"env": [{"name": "CONFIG_FILE", "value": "/x"}]}}, "devicePlugin.env CONFIG_FILE"),
    ({"mig": {"strategy": "single"}}, "mig.strategy"),
    ({"devicePlugin": {"config": {"name": "my-plugin-config", "default": "renamed"}}}, "devicePlugin.config"),
    ({"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-passthrough"}}, "sandboxWorkloads.enabled"),
])
def test_operator_values_that_rename_the_advertised_gpus_are_refused(site: dict[str, Any], where: str) -> None:
    (violation,) = renaming(site)
    assert violation.startswith(f"gpushare:operatorValues.{where}: ")


@pytest.mark.parametrize("site", [
    None,
    {"devicePlugin": {"repository": "mirror.example.net/nvidia", "args": ["--fail-on-init-error=false"]}},
    {"devicePlugin": {"resources": {"limits": {"memory": "512Mi"}}}, "sandboxWorkloads": {"enabled": False}},
    {"toolkit": {"repository": "mirror.example.net/nvidia"}},
])
def test_site_additions_that_keep_the_names_are_allowed(site: dict[str, Any] | None) -> None:
    assert renaming(site) == []


@pytest.fixture(scope="module")
def dev_plan() -> list[Any]:
    from gpushare.ops.preview import plan_resources

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GPUSHARE_ROOT", str(WORKSPACE))
        return plan_resources("dev")


def test_a_plan_whose_operator_release_renames_the_gpus_is_refused(dev_plan: list[Any]) -> None:
    import copy
    from dataclasses import replace

    assert renaming(plan=dev_plan) == []  # the neighbour: the program's own values keep the cluster's names
    plan = copy.deepcopy(dev_plan)
    (i, release), = [(i, r) for i, r in enumerate(plan) if str(r.inputs.get("chart", "")).endswith("gpu-operator")]
    values = copy.deepcopy(dict(release.inputs["values"]))
    values["mig"]["strategy"] = "single"
    plan[i] = replace(release, inputs={**release.inputs, "values": values})
    (violation,) = renaming(plan=plan)
    assert violation.startswith(f"release {release.name}, mig.strategy: ")


def test_the_program_refuses_site_values_that_rename_the_gpus() -> None:
    from gpushare.ops.preview import collect_plan

    config = yaml.safe_load((WORKSPACE / "Pulumi.dev.yaml").read_text())["config"]
    site = {"devicePlugin": {"args": ["--mig-strategy", "single"]}}
    with pytest.raises(GpushareError) as info:
        collect_plan("dev", {**config, "gpushare:operatorValues": site})
    problem = only(info.value.problems)
    assert problem.path == "gpushare:operatorValues.devicePlugin.args" and "--mig-strategy" in problem.message
    mirrored = {"devicePlugin": {"repository": "mirror.example.net/nvidia"}}
    assert collect_plan("dev", {**config, "gpushare:operatorValues": mirrored}).resources
