"""Rules over the NVIDIA Container Toolkit: every version the environment, the stack or the plan sets is at or
above the CVE floor, and the rendered config.toml carries every hardened setting."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator, Mapping
from typing import Any

from gpushare.core.guardrails import StartsWith
from gpushare.core.mappings import dig
from gpushare.core.nvidia.operator import gpu_operator_chart_values
from gpushare.core.nvidia.toolkit import image_tag, is_toolkit_image, toolkit_version_of
from gpushare.core.spec import version_tuple
from gpushare.core.stacks import OPERATOR_VALUES_KEY
from gpushare.policy.registry import Context, Finding, operator_releases, rule, site_operator_values
from gpushare.render.fleet import render_fleet


def _fields_named(node: Any, key: str, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            where = f"{path}.{k}" if path else str(k)
            if k == key and v is not None:
                yield where, v
            else:
                yield from _fields_named(v, key, where)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _fields_named(v, key, f"{path}[{i}]")


def _container_images(node: Any) -> Iterator[str]:
    """Every container image in a resource's inputs (a mapping with a name and a string image)."""
    if isinstance(node, Mapping):
        if isinstance(node.get("image"), str) and "name" in node:
            yield node["image"]
        for v in node.values():
            yield from _container_images(v)
    elif isinstance(node, list):
        for v in node:
            yield from _container_images(v)


def toolkit_versions(ctx: Context) -> list[tuple[str, str]]:
    """(where, version or tag) for every source of a toolkit version: the environment file (defaults, and any pool or
    host that sets one), the resolved nodes, the stack's operator values, the GPU Operator releases in the plan (their
    toolkit.version, or the chart's default where the toolkit operand runs) and every toolkit image the plan sets."""
    out: list[tuple[str, str]] = [(w, str(v)) for w, v in _fields_named(ctx.fleet.env.model_dump(), "toolkit_version")]
    declared = {v for _, v in out}
    for node in ctx.fleet.nodes:
        if node.toolkit_version and node.toolkit_version not in declared:
            out.append((f"pool {node.pool}, host {node.name}", node.toolkit_version))
    site = dig(site_operator_values(ctx), "toolkit", "version")
    if site is not None:
        out.append((f"{OPERATOR_VALUES_KEY}.toolkit.version", str(site)))
    chart = gpu_operator_chart_values()["toolkit"]
    for release, values in operator_releases(ctx):
        toolkit = values.get("toolkit") or {}
        if toolkit.get("version") is not None:
            out.append((f"release {release}, toolkit.version", str(toolkit["version"])))
        elif toolkit.get("enabled", chart["enabled"]):
            out.append((f"release {release}, toolkit.version (chart default)", str(chart["version"])))
    for r in ctx.plan or []:
        if r.type.endswith("helm.sh/v3:Release"):
            continue
        for image in _container_images(r.inputs):
            if is_toolkit_image(image):
                out.append((f"{r.type.rsplit(':', 1)[-1]} {r.name}, image {image}", image_tag(image)))
    return out


@rule("toolkit-cve-floor", "mandatory",
      "Every NVIDIA Container Toolkit version the environment, the stack or the plan sets (defaults, pools, hosts, "
      "GPU Operator values, toolkit images) is at or above the CVE floor.",
      "raise the named version (defaults.toolkit_version, the operator's toolkit.version, the image tag) to the floor "
      "in policies/guardrails.yaml or newer")
def _toolkit_floor(ctx: Context) -> Iterator[Finding]:
    floor = ctx.guardrails.toolkit.min_version
    seen: set[str] = set()
    for where, text in toolkit_versions(ctx):
        if where in seen:
            continue
        seen.add(where)
        version = toolkit_version_of(text)
        if version is None:
            yield where, f"toolkit {text or '(no tag)'} names no version, so the floor {floor} cannot be shown"
        elif version_tuple(version) < version_tuple(floor):
            cves = ", ".join(f"{f.cve} (fixed in {f.fixed_in})" for f in ctx.guardrails.toolkit.unfixed(version))
            yield where, f"toolkit {text} is below the floor {floor}; exposed to {cves}"


def _toml_setting(data: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _hardened_value(want: bool | StartsWith) -> str:
    return f"a string starting with {want.prefix!r}" if isinstance(want, StartsWith) else str(want).lower()


@rule("toolkit-hardened", "mandatory",
      "The rendered nvidia-container-runtime config.toml carries every hardened setting policies/guardrails.yaml "
      "lists (toolkit.hardened, nested tables by dotted path); a missing setting fails.",
      "render with gpushare's template (gpushare/templates/nvidia-container-toolkit-config.toml.j2) unchanged")
def _toolkit_hardened(ctx: Context) -> Iterator[Finding]:
    where = "nvidia-container-toolkit/config.toml"
    rendered = ctx.rendered
    if rendered is None:
        rendered = render_fleet(ctx.fleet).files
    text = rendered.get(where)
    if text is None:
        yield where, "the toolkit config.toml was not rendered"
        return
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        yield where, f"the rendered config.toml is not TOML: {exc}"
        return
    for key, want in ctx.guardrails.toolkit.hardened.items():
        present, value = _toml_setting(data, key)
        if isinstance(want, StartsWith):
            ok = present and isinstance(value, str) and value.startswith(want.prefix)
        else:
            ok = present and isinstance(value, bool) and value is want
        if not ok:
            found = f"is {json.dumps(value)}" if present else "is missing"
            yield where, f"{key} {found}; it must be {_hardened_value(want)}"
