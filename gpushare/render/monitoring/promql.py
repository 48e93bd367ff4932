"""Small PromQL helpers: kube-state-metrics name sanitising, regex alternatives, and reading the metric names an
expression refers to (so tests can prove that every rule and panel reads only exported or recorded metrics)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


# dcgm-exporter's node label: `hostname` from NVIDIA/dcgm-exporter d5e5f51 (#655, May 2026) on, so in 4.6.0-4.8.3,
# the exporter the pinned GPU Operator v26.7.0 runs; `Hostname` up to 4.5.3-4.8.2. A fleet may run both while it
# upgrades, and history keeps the old spelling: every DCGM join accepts either.
HOST_LABEL = "hostname"
LEGACY_HOST_LABEL = "Hostname"
HOST_LABELS = f"{HOST_LABEL}, {LEGACY_HOST_LABEL}"  # grouping by both keeps whichever a series has


def dcgm_host(expr: str) -> str:
    """A DCGM expression with the node's name in `hostname` whichever spelling its exporter wrote (the old label
    stays until an aggregation or `without` drops it)."""
    return f'label_replace({expr}, "{HOST_LABEL}", "$1", "{LEGACY_HOST_LABEL}", "(.+)")'


def ksm_name(name: str) -> str:
    """kube-state-metrics' spelling of a Kubernetes name in a label (value): `nvidia.com/gpu` -> `nvidia_com_gpu`."""
    return _INVALID.sub("_", name)


def ksm_label(k8s_label: str) -> str:
    """The kube_node_labels label for a node label (exported only if the allowlist names it)."""
    return "label_" + ksm_name(k8s_label)


def alternatives(values: Iterable[str]) -> str:
    """A PromQL regex string body matching exactly these values (RE2 is anchored by PromQL)."""
    escaped = sorted({re.sub(r"([.+*?()|\[\]{}^$\\])", r"\\\\\1", v) for v in values})
    return "|".join(escaped)


# ---------------------------------------------------------------- reading expressions

_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "inf", "nan", "atan2",
})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])")
_NUMBER_SUFFIX = re.compile(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", re.IGNORECASE)


def metric_names(expr: str) -> set[str]:
    """Metric names selected by an expression: identifiers that are not functions, keywords or label names.

    Strings, label matchers, ranges and grouping clauses are removed first, so label names and values never count
    as metrics. Selectors by `__name__` are not supported (gpushare's rules use none; a test keeps it so)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBER_SUFFIX.sub(" ", text)
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        name = match.group(1)
        rest = text[match.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or aggregation
        if name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def substitute_variables(expr: str, values: Mapping[str, str]) -> str:
    """Grafana's variables replaced by concrete values (`$pool`, `${pool}`, `$__rate_interval`)."""
    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for dashboard variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)", replace, expr)
