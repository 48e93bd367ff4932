"""The adoption stage of an imported cluster: what `gpushare check` needs to pass on the cluster as it runs, written
beside the import and reviewed in Git like every threshold.

- Limits for an environment policies/guardrails.yaml does not name: `policies/guardrails.d/<env>.yaml`, measured
  on the imported fleet (its oversubscription, its replicas per memory class, its profiles), so the file states
  the cluster's reality and nothing looser.
- For every mandatory rule the imported environment breaks and may be waived: a dated waiver naming the one place,
  with the step that fixes it, in `policies/waivers.d/<env>-adoption.yaml` (expiring max_waiver_days ahead).
- What may not be waived (the environment's non_waivable rules) is the remediation plan: listed first, and `check`
  keeps failing on it until it is fixed.

The rules are run exactly as `gpushare check` runs them, on a copy of the workspace with the imported files in it,
so what the import writes is what check will find."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError
from gpushare.core.files import yaml_text
from gpushare.core.guardrails import load_guardrails
from gpushare.core.paths import WORKSPACE_MARKER, environment_path
from gpushare.core.resolve import resolve
from gpushare.core.spec import SHARED_KINDS
from gpushare.ops.preview import plan_resources
from gpushare.policy.context import context_for, load_checked_guardrails
from gpushare.policy.evaluate import evaluate
from gpushare.policy.registry import shared_replicas
from gpushare.policy.waivers import load_waivers


@dataclass
class AdoptionStage:
    files: dict[str, str] = field(default_factory=dict)  # path relative to the workspace -> text
    waived: list[dict[str, str]] = field(default_factory=list)  # {rule, where, message, fix}
    remediation: list[dict[str, str]] = field(default_factory=list)  # non-waivable: {rule, where, message, fix}

    def as_dict(self) -> dict[str, Any]:
        return {"files": sorted(self.files), "waived": self.waived, "remediation": self.remediation}


@contextmanager
def _workspace_copy(workspace: Path, files: dict[str, str]) -> Iterator[Path]:
    """The workspace's policies, profiles, environments and stacks with `files` added, in a temporary folder that
    is the project root while the block runs."""
    with tempfile.TemporaryDirectory(prefix="gpushare-adopt-") as tmp:
        root = Path(tmp)
        shutil.copy2(workspace / WORKSPACE_MARKER, root / WORKSPACE_MARKER)
        for name in ("policies", "profiles", "environments"):
            if (workspace / name).is_dir():
                shutil.copytree(workspace / name, root / name, symlinks=False)
        for path in workspace.glob("Pulumi*.yaml"):
            shutil.copy2(path, root / path.name)
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        before = os.environ.get("GPUSHARE_ROOT")
        os.environ["GPUSHARE_ROOT"] = str(root)
        try:
            yield root
        finally:
            if before is None:
                os.environ.pop("GPUSHARE_ROOT", None)
            else:
                os.environ["GPUSHARE_ROOT"] = before


def measured_limits(env: str) -> dict[str, Any]:
    """Guardrail limits that the imported environment meets as it runs: its oversubscription (rounded up to a
    hundredth), its largest replicas per memory class (2 where it shares none), its profiles."""
    fleet = resolve(environment_path(env))
    g = load_guardrails()
    replicas = {c.name: 2 for c in g.memory_classes}
    for node in (n for n in fleet.nodes if n.sharing in SHARED_KINDS):
        n = shared_replicas(fleet, node)
        memories = [node.gpu_model.memory_gib] if node.mig_layout is None else [
            node.gpu_model.profiles[p].memory_gib or 0.0 for p in node.mig_layout]
        for memory in memories:
            cls = g.memory_class(memory)
            replicas[cls] = max(replicas[cls], min(n, 64))
    ratio = max(1.0, math.ceil(fleet.totals.oversubscription * 100) / 100)
    return {"max_oversubscription": ratio, "max_shared_replicas": replicas,
            "allowed_profiles": sorted({n.profile for n in fleet.nodes}),
            "require_fail_requests_greater_than_one": False, "require_exact_mig_placements": False,
            "quota_above_capacity": "warning",
            "non_waivable": ["untrusted-tenants-hardware-isolated", "toolkit-cve-floor",
                             "untrusted-tenants-need-enforced-admission"]}


def _glob_literal(text: str) -> str:
    """A waiver's `where` is a glob: the location as written, its glob characters taken literally."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def adoption_stage(workspace: Path, env: str, files: dict[str, str], today: date) -> AdoptionStage:
    """The guardrails fragment and waivers that let `gpushare check --env ENV` pass on the imported cluster, and
    what no waiver may cover. `files`: the import's own files (relative paths -> text)."""
    stage = AdoptionStage()
    with _workspace_copy(workspace, files) as root:
        if env not in load_guardrails(root / "policies" / "guardrails.yaml").environments:
            limits = measured_limits(env)
            text = _guardrails_text(env, limits, today)
            stage.files[f"policies/guardrails.d/{env}.yaml"] = text
            (root / "policies" / "guardrails.d").mkdir(exist_ok=True)
            (root / "policies" / "guardrails.d" / f"{env}.yaml").write_text(text)
        try:
            plan = plan_resources(env)
        except GpushareError:
            plan = None  # `gpushare check` reports the same problem; the rules that need no plan still judge
        ctx = context_for(env, plan, guardrails=load_checked_guardrails())
        waivers, waivers_file = load_waivers(None, ctx.guardrails)
        report = evaluate(ctx, waivers, today, waivers_file)
    non_waivable = set(ctx.limits.non_waivable)
    entries = []
    expires = today + timedelta(days=ctx.guardrails.max_waiver_days)
    for v in report.violations:
        if v.level != "mandatory":
            continue
        found = {"rule": v.rule, "where": v.where, "message": v.message, "fix": v.fix}
        if v.rule in non_waivable or v.rule.startswith("waiver-"):
            stage.remediation.append(found)
            continue
        stage.waived.append(found)
        entries.append({"rule": v.rule, "environment": env, "where": _glob_literal(v.where),
                        "reason": f"adopted as the cluster ran on {today.isoformat()}; to do: {v.fix}",
                        "approved_by": "gpushare import (review before merging)", "expires": expires.isoformat()})
    if entries:
        stage.files[f"policies/waivers.d/{env}-adoption.yaml"] = _waivers_text(env, entries, today)
    return stage


def _guardrails_text(env: str, limits: dict[str, Any], today: date) -> str:
    head = (f"# Limits of environment {env}, written by `gpushare import` on {today.isoformat()}: the adoption stage,\n"
            "# measured on the cluster as it ran (its oversubscription, replicas per memory class and profiles), so\n"
            "# check passes on what runs and nothing looser is allowed. Tighten them in reviewed changes\n"
            "# (docs/adoption.md); they are read with policies/guardrails.yaml, which names no such environment.\n")
    body = {"apiVersion": "gpushare.io/v1", "kind": "Guardrails", "environments": {env: limits}}
    return head + yaml_text(body)


def _waivers_text(env: str, entries: list[dict[str, str]], today: date) -> str:
    head = (f"# Waivers of the adoption of {env}, written by `gpushare import` on {today.isoformat()}: each names one\n"
            "# rule the cluster broke as it ran, the one place, and the step that fixes it. They expire; fix what\n"
            "# each says (docs/adoption.md) and delete it. `gpushare check` reads them with policies/waivers.yaml.\n")
    body = {"apiVersion": "gpushare.io/v1", "kind": "Waivers", "waivers": entries}
    return head + yaml_text(body)
