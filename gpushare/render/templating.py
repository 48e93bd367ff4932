"""The Jinja2 environment over the package's templates: strict undefined names, no autoescape (YAML and TOML,
never HTML), filters that turn data into YAML and TOML values so templates stay thin."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import yaml


def templates_dir() -> Path:
    """The Jinja2 templates of every file NVIDIA's tools read: package data, never the workspace's."""
    return Path(__file__).resolve().parents[1] / "templates"


def _to_yaml(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False, width=120).rstrip("\n")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - renders YAML and TOML, never HTML
    )
    env.filters["to_yaml"] = _to_yaml
    env.filters["tomlv"] = _toml_value
    return env
