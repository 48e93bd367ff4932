"""Waivers: policies/waivers.yaml and policies/waivers.d/*.yaml read and checked (each names a rule and an
environment that exist), the locations a waiver may name, and why one cannot be accepted."""

from __future__ import annotations

import fnmatch
import re
from datetime import date, timedelta
from pathlib import Path
from typing import Annotated

from pydantic import Field, PrivateAttr, field_validator

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.guardrails import Guardrails, load_guardrails
from gpushare.core.loading import Strict, invalid, load_model
from gpushare.core.paths import project_root
from gpushare.policy.registry import RENAMED, Context, Violation, current_id
from gpushare.policy.rules import RULES


class Waiver(Strict):
    rule: str
    environment: str
    where: str = Field(description="Glob over the one violation location it covers, e.g. 'pool h200-inference'.")
    reason: Annotated[str, Field(min_length=10)]
    expires: Annotated[date, Field(strict=False)]  # YAML gives the date as text (gpushare.files)
    approved_by: str | None = None

    @field_validator("rule")
    @classmethod
    def _known_rule(cls, value: str) -> str:
        if value not in RULES and value not in RENAMED:  # an old id still reads
            raise invalid(f"no rule named {value!r}", f"use one of: {', '.join(sorted(RULES))}")
        return value

    # Where it was read ("file: waivers[i]"), for waivers read from several files; set by load_waivers.
    _location: str | None = PrivateAttr(None)

    @property
    def rule_id(self) -> str:
        """The rule's id now (the waiver may spell an old one)."""
        return current_id(self.rule)

    def covers(self, environment: str, violation: Violation) -> bool:
        level = RENAMED[self.rule][1] if self.rule in RENAMED else None
        return (self.rule_id == violation.rule and level in (None, violation.level)
                and self.environment == environment and fnmatch.fnmatchcase(violation.where, self.where))


class Waivers(Strict):
    waivers: list[Waiver] = Field(default_factory=list)


def waivers_path() -> Path:
    return project_root() / "policies" / "waivers.yaml"


def load_waivers(path: Path | None = None, guardrails: Guardrails | None = None) -> tuple[list[Waiver], str]:
    """The waivers and the file they came from. The default file may be absent; a file named explicitly may not.
    Every waiver names an environment policies/guardrails.yaml knows (expired or not: a misspelt one waives nothing
    and would never be reported as expired)."""
    if path is not None and not path.exists():
        raise GpushareError(Problem("waivers file not found", file=str(path),
                                    fix="check the --waivers path, or leave --waivers out to use "
                                        "policies/waivers.yaml (which may be absent)"), exit_code=2)
    files = [path] if path is not None else [waivers_path(), *waiver_fragment_paths()]
    known = (guardrails or load_guardrails()).environments
    waivers: list[Waiver] = []
    problems: list[Problem] = []
    first = str(files[0])
    for file in files:
        if not file.exists():
            continue
        loaded, doc = load_model(file, Waivers, "Waivers", "waivers file",
                                 "the commented waivers.yaml that `gpushare init` writes", empty={})
        if file == files[0]:
            first = doc.file
        for i, w in enumerate(loaded.waivers):
            w._location = f"{doc.file}: waivers[{i}]"
            if w.environment not in known:
                problems.append(doc.problem(("waivers", i, "environment"), f"waiver of {w.rule} names environment "
                                            f"{w.environment!r}, which policies/guardrails.yaml does not know",
                                            f"use one of: {', '.join(known)}"))
        waivers.extend(loaded.waivers)
    if problems:
        raise GpushareError(problems)
    return waivers, first


def waiver_fragment_paths() -> list[Path]:
    """policies/waivers.d/*.yaml: waivers kept apart from waivers.yaml (`gpushare import` writes an adopted
    cluster's there, dated), read with it unless --waivers names one file."""
    folder = project_root() / "policies" / "waivers.d"
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


# The violations about waivers themselves: (description, remediation).
WAIVER_RULES: dict[str, tuple[str, str]] = {
    "waiver-expired": ("A waiver in policies/waivers.yaml has expired.",
                       "fix what it waived, or renew it with a new reason and expiry after review"),
    "waiver-refused": ("A waiver in policies/waivers.yaml cannot be accepted: it covers a non-waivable rule (now, or "
                       "at the base of the change under review), matches more than max_waiver_matches objects (or "
                       "everything), or expires more than max_waiver_days ahead.",
                       "narrow the waiver to one object and a nearer expiry, or fix what it waives"),
}


def waiver_targets(ctx: Context) -> set[str]:
    """The locations a waiver's `where` can name: every object of the fleet, as the rules spell locations."""
    fleet = ctx.fleet
    out = {f"environment {ctx.name}", "defaults.toolkit_version", "nvidia-container-toolkit/config.toml"}
    out |= {f"cluster {c}" for c in fleet.clusters}
    out |= {f"profile {p}" for p in fleet.profiles}
    out |= {f"config {c}" for c in fleet.device_plugin_configs}
    for pool in fleet.pools:
        out.add(f"pool {pool.name}")
        out |= {f"pool {pool.name}, host {n.name}" for n in pool.nodes}
    for t in fleet.tenants:
        out.add(f"tenant {t.name}")
        out |= {f"tenant {t.name}, cluster {c}" for c in t.clusters}
        out |= {f"tenant {t.name}, quota {r}" for r in t.quota}
        out |= {f"tenant {t.name}, borrowing_limit {r}" for r in t.borrowing_limit}
    return out


def _matches_everything(glob: str) -> bool:
    """A glob with no literal character (`*`, `**`, `[a-z]*`) matches whatever a rule reports."""
    return not re.sub(r"\[[^]]*\]|[*?]", "", glob).strip()


def waiver_refusal(ctx: Context, waiver: Waiver, today: date, targets: set[str]) -> tuple[str, str] | None:
    """Why a waiver cannot be accepted, with the fix; None when it can."""
    g = ctx.guardrails
    if waiver.rule_id in {current_id(r) for r in ctx.limits.non_waivable}:
        return (f"{waiver.rule} cannot be waived in {ctx.name} (policies/guardrails.yaml "
                f"environments.{ctx.name}.non_waivable)", f"fix what {waiver.rule} reports and remove the waiver")
    if waiver.rule_id in {current_id(r) for r in ctx.base_non_waivable}:
        return (f"{waiver.rule} is non-waivable in {ctx.name} at {ctx.base} (policies/guardrails.yaml "
                f"environments.{ctx.name}.non_waivable): this change lifts it from non_waivable and waives it at once",
                "propose the change to non_waivable on its own; once it has merged, the waiver can follow in a "
                "review of its own")
    latest = today + timedelta(days=g.max_waiver_days)
    if waiver.expires > latest:
        return (f"the waiver of {waiver.rule} expires on {waiver.expires.isoformat()}, more than "
                f"{g.max_waiver_days} days after {today.isoformat()}",
                f"set expires to {latest.isoformat()} or earlier, and renew it after review")
    if _matches_everything(waiver.where):
        return (f"the waiver of {waiver.rule} has where {waiver.where!r}, which matches everything",
                "name the one object it covers, e.g. where: 'pool h200-inference'")
    matched = sorted(t for t in targets if fnmatch.fnmatchcase(t, waiver.where))
    if len(matched) > g.max_waiver_matches:
        shown = ", ".join(matched[:5]) + (", ..." if len(matched) > 5 else "")
        return (f"the waiver of {waiver.rule} has where {waiver.where!r}, which matches {len(matched)} objects "
                f"({shown}); at most {g.max_waiver_matches} may be waived at once",
                "narrow where to the one object it covers, or fix the others")
    return None
