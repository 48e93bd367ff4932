"""JSON Schemas of the workspace's files, for editors (yaml-language-server) and reviewers: generated from the
same models that validate them, so they cannot disagree."""

from __future__ import annotations

from typing import Any

from gpushare.core.guardrails import Guardrails
from gpushare.core.prices import Prices
from gpushare.core.spec import PROFILE_ADAPTER, Environment, with_header


def json_schemas() -> dict[str, dict[str, Any]]:
    env = with_header(Environment.model_json_schema(), "Environment")
    env["title"] = "gpushare environment"
    profile = PROFILE_ADAPTER.json_schema()
    profile["title"] = "gpushare sharing profile"
    for name, definition in profile.get("$defs", {}).items():
        if name.endswith("Profile"):  # a profile file's `kind` is its sharing mode: only apiVersion is added
            with_header(definition, None)
    guardrails = with_header(Guardrails.model_json_schema(), "Guardrails")
    guardrails["title"] = "gpushare guardrails"
    prices = with_header(Prices.model_json_schema(), "Prices")
    prices["title"] = "gpushare GPU prices"
    return {"environment.schema.json": env, "profile.schema.json": profile, "guardrails.schema.json": guardrails,
            "prices.schema.json": prices}
