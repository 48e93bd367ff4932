"""JSON Schemas of the workspace's files, for editors (yaml-language-server) and reviewers: generated from the
same models that validate them, so they cannot disagree."""

from __future__ import annotations

from typing import Any

from gpushare.core.guardrails import Guardrails
from gpushare.core.spec import PROFILE_ADAPTER, Environment


def json_schemas() -> dict[str, dict[str, Any]]:
    env = Environment.model_json_schema()
    env["title"] = "gpushare environment"
    profile = PROFILE_ADAPTER.json_schema()
    profile["title"] = "gpushare sharing profile"
    guardrails = Guardrails.model_json_schema()
    guardrails["title"] = "gpushare guardrails"
    return {"environment.schema.json": env, "profile.schema.json": profile, "guardrails.schema.json": guardrails}
