"""What the rules judge for `--env ENV`: the environment's resolved fleet, the checked guardrails (the rule ids they
name must exist), the environment it is promoted from, and the Pulumi stack that deploys it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.guardrails import Guardrails, guardrails_path, load_guardrails, non_waivable_at
from gpushare.core.paths import environment_path, project_root
from gpushare.core.resolve import environment_stem, resolve, resolve_env
from gpushare.core.stacks import ENVIRONMENT_KEY, environment_file, stack_config
from gpushare.policy.registry import RENAMED, Context, PlanResource
from gpushare.policy.rules import RULES


def load_checked_guardrails(path: Path | None = None) -> Guardrails:
    """policies/guardrails.yaml, with the rule ids it names (non_waivable) checked against the rules here."""
    guardrails = load_guardrails(path)
    problems = [Problem(f"environments.{env}.non_waivable names unknown rule(s) {', '.join(unknown)}",
                        file=str(path or guardrails_path()), path=f"environments.{env}.non_waivable",
                        fix=f"use rule ids of `gpushare check`: {', '.join(sorted(RULES))}")
                for env, limits in guardrails.environments.items()
                if (unknown := [r for r in limits.non_waivable if r not in RULES and r not in RENAMED])]
    if problems:
        raise GpushareError(problems)
    return guardrails


def stack_settings(env: str) -> dict[str, Any] | None:
    """The config of the Pulumi stack that deploys this environment (Pulumi.<stack>.yaml), where one does."""
    if not env.endswith((".yaml", ".yml")) and os.sep not in env and not (project_root() / f"Pulumi.{env}.yaml"
                                                                          ).exists():
        return None
    _, config, notes = stack_config(env)
    return None if notes else config


def context_for(env: str, plan: list[PlanResource] | None = None, guardrails: Guardrails | None = None,
                base: str | None = None) -> Context:
    """The rules' input for `--env ENV`: the environment is the one ENV names (its file name), whatever it says.
    `base`: the Git revision the change under review merges into; the rules non-waivable there stay so."""
    path = environment_path(env)
    fleet = resolve(path)
    named = environment_stem(path)
    g = guardrails or load_checked_guardrails()
    limits = g.environment(named)
    source, missing = None, None
    if limits.promote_from:
        try:
            path_of_source = environment_path(limits.promote_from)
        except GpushareError:  # no such file: the promotion rule says so, with its fix
            missing = limits.promote_from
        else:
            source = resolve_env(str(path_of_source))
    config = stack_settings(env)

    deployed = environment_file(config[ENVIRONMENT_KEY]) if config and config.get(ENVIRONMENT_KEY) else None
    return Context(fleet=fleet, guardrails=g, plan=plan, promotion_source=source, promotion_missing=missing,
                   environment=named,
                   stack_config=config, deployed=deployed, base=base,
                   base_non_waivable=non_waivable_at(base, named) if base else ())

