"""Running the real promtool on gpushare's rendered rules, and rendering the promtool test files in tests/promtool/.

The test files are Jinja templates so that their inputs follow the thresholds in policies/guardrails.yaml (one
source). An expected alert may carry `value:`; the harness then fills `exp_annotations` from the rule's own
annotation templates, as Prometheus would expand them for those labels and that value.

Each file is rendered once per spelling of dcgm-exporter's node label (`host` in the templates; `other` is the other
spelling): `hostname`, which the exporter the pinned GPU Operator runs writes, and `Hostname` from older exporters."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import yaml

from gpushare.core.guardrails import Guardrails, duration_seconds
from gpushare.render.monitoring.promql import HOST_LABEL, LEGACY_HOST_LABEL

PROMTOOL_TESTS = Path(__file__).resolve().parents[1] / "promtool"
MONITORING_ENV = Path(__file__).resolve().parent / "monitoring-test.yaml"
# Spelling of dcgm-exporter's node label -> what the rendered file's name gets before `.test.yaml`.
HOST_SPELLINGS = {HOST_LABEL: "", LEGACY_HOST_LABEL: ".Hostname"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        raise RuntimeError("promtool is not installed: run `make promtool` (Debian's prometheus package)")
    return found


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def _go_value(value: float) -> str:
    """`{{ $value }}` as Go's %v prints a float64."""
    if value == int(value) and abs(value) < 1e21:
        return str(int(value))
    return repr(float(value))


def _expand(template: str, labels: dict[str, str], value: float | None) -> str:
    """The subset of Prometheus' alert templates gpushare's rules use: $labels.X, $value, humanizePercentage."""
    def replace(match: re.Match[str]) -> str:
        body = match.group(1).strip()
        if body.startswith("$labels."):
            return labels.get(body[len("$labels."):], "")
        if value is None:
            raise ValueError(f"annotation {template!r} needs the alert's value: give `value:` in the test")
        if body == "$value":
            return _go_value(value)
        if body == "$value | humanizePercentage":
            return f"{value * 100:.4g}%"
        raise ValueError(f"no expansion for {{{{ {body} }}}} in the test harness")

    return re.sub(r"\{\{(.*?)\}\}", replace, template)


def rules_by_alert(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def render_tests(groups: list[dict[str, Any]], guardrails: Guardrails, fractions: dict[str, float],
                 out: Path) -> dict[str, dict[str, Any]]:
    """Render every tests/promtool/*.test.yaml.j2 into `out` (beside rules.yaml), once per spelling of the node
    label; returns name -> parsed test."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(PROMTOOL_TESTS)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    alerts = rules_by_alert(groups)
    negative = sorted({r["record"] for g in groups for r in g["rules"]
                       if "record" in r and not r["expr"].startswith("vector(")})
    rendered: dict[str, dict[str, Any]] = {}
    for template, (host, suffix) in ((t, h) for t in sorted(PROMTOOL_TESTS.glob("*.test.yaml.j2"))
                                     for h in HOST_SPELLINGS.items()):
        other = next(h for h in HOST_SPELLINGS if h != host)
        text = env.get_template(template.name).render(
            m=guardrails.monitoring, frac=fractions, negative_records=negative,
            minutes=lambda d: duration_seconds(d) // 60, host=host, other=other)
        data = yaml.safe_load(text)
        for test in data["tests"]:
            for case in test.get("alert_rule_test", []):
                rule = alerts[case["alertname"]]
                for alert in case.get("exp_alerts") or []:
                    value = alert.pop("value", None)
                    if "exp_annotations" not in alert:
                        labels = {k: str(v) for k, v in alert.get("exp_labels", {}).items()}
                        alert["exp_annotations"] = {k: _expand(v, labels, value)
                                                    for k, v in rule.get("annotations", {}).items()}
        name = template.name.removesuffix(".test.yaml.j2") + suffix + ".test.yaml"
        (out / name).write_text(yaml.safe_dump(data, sort_keys=False, width=200, allow_unicode=True))
        rendered[name] = data
    return rendered
