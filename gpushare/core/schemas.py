"""JSON Schemas of the workspace's files, for editors (yaml-language-server) and reviewers: generated from the
same models that validate them, so they cannot disagree."""

from __future__ import annotations

from typing import Any

from gpushare.core.guardrails import Guardrails
from gpushare.core.loading import with_header
from gpushare.core.prices import Prices
from gpushare.core.spec import PROFILE_ADAPTER, Environment
from gpushare.core.spec.v1 import patterns


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


# ---------------------------------------------------------------- the field reference in docs/environments.md

REFERENCE_BEGIN = "<!-- field reference: generated from gpushare/core/spec/v1/ by scripts/field_reference.py -->"
REFERENCE_END = "<!-- end of the field reference -->"


def _pattern_names() -> dict[str, str]:
    """A regex of the schema -> how the reference names it: each TextRule's own wording, and the version patterns."""
    names = {patterns.NAME_PATTERN: "a DNS label", patterns.VERSION_PATTERN: "a version, N.N or N.N.N",
             patterns.KUBERNETES_MINOR_PATTERN: "a Kubernetes minor, 1.NN", patterns.DRA_DRIVER_VERSION_PATTERN:
             "a release, vN.N.N", patterns.FEATURE_GATE_PATTERN: "a feature gate name"}
    for value in vars(patterns).values():
        for meta in getattr(value, "__metadata__", ()):
            if isinstance(meta, patterns.TextRule):
                names.setdefault(meta.pattern, meta.what)
    return names


def _type(node: dict[str, Any], names: dict[str, str]) -> str:
    """A schema node in words, for a markdown cell."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    if "const" in node:
        return f"`{node['const']}`"
    if "oneOf" in node:
        return "one of " + ", ".join(_type(n, names) for n in node["oneOf"])
    if "anyOf" in node:
        options = [n for n in node["anyOf"] if n.get("type") != "null"]
        if all("format" in n and len(n) == 1 for n in options):
            return "an IP address or a hostname"
        return " or ".join(_type(n, names) for n in options)
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    kind = node.get("type")
    if kind == "array":
        least = f", at least {node['minItems']}" if node.get("minItems") else ""
        return f"list of {_type(node['items'], names)}{least}"
    if kind == "object" and "enum" in node.get("propertyNames", {}):  # keys from a fixed set (a Literal)
        return f"map of {_type(node['propertyNames'], names)} to {_type(node['additionalProperties'], names)}"
    if kind == "object":
        (key, value), = node["patternProperties"].items()
        return f"map of {names.get(key, 'key')} to {_type(value, names)}"
    if kind == "integer":
        low, high = node.get("minimum"), node.get("maximum")
        bounds = f" {low}..{high}" if low is not None and high is not None else \
            f" >= {low}" if low is not None else ""
        return "integer" + bounds
    if kind == "boolean":
        return "boolean"
    if kind == "string":
        if "not" in node:
            return "text, no `{{`, `{%`, `{#`, `$(` or backticks"
        pattern = node.get("pattern")
        if pattern is None:
            return "text"
        return names.get(pattern, f"text matching `{pattern}`".replace("|", "\\|"))
    raise ValueError(f"no words for the schema node {node}")


def _default(name: str, node: dict[str, Any], required: list[str]) -> str:
    if name in required:
        return "required"
    if "const" in node:  # apiVersion and kind: a file without them reads as this
        return f"`{node['const']}`"
    if "default" not in node or node["default"] in ([], {}, ""):
        return "empty"  # a list or map made fresh for each file (pydantic's default_factory)
    value = node["default"]
    if value is None:
        return "absent"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _refs(node: Any) -> list[str]:
    """The models a schema node refers to, in the order they appear."""
    if isinstance(node, dict):
        own = [node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else []
        return own + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def field_reference() -> str:
    """Every field of an environment file (and of the profiles it may hold), one table per model, from the same
    JSON Schema editors get: what docs/environments.md shows between its markers."""
    schema = json_schemas()["environment.schema.json"]
    defs: dict[str, Any] = schema["$defs"]
    names = _pattern_names()
    order: list[str] = []

    def visit(name: str) -> None:  # each model right after the one that first refers to it
        if name not in order:
            order.append(name)
            for ref in _refs((schema if name == "Environment" else defs[name])["properties"]):
                visit(ref)

    visit("Environment")
    lines = []
    for name in order:
        node = schema if name == "Environment" else defs[name]
        lines += [f"### {name}", ""]
        if name == "Environment":
            lines += ["The file itself.", ""]
        elif node.get("description"):
            lines += [node["description"], ""]
        lines += ["| field | type | default | description |", "|---|---|---|---|"]
        required = node.get("required", [])
        for field, spec in node["properties"].items():
            about = spec.get("description", "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{field}` | {_type(spec, names)} | {_default(field, spec, required)} | {about} |")
        lines.append("")
    return "\n".join(lines)
