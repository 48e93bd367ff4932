"""The Jinja2 environment over the package's templates: strict undefined names, no autoescape (YAML and TOML,
never HTML), filters that turn data into YAML and TOML values so templates stay thin.

The filters are gpushare's one writer of each format: `to_yaml` is gpushare.core.files.yaml_text, `tomlv` the TOML
encoder of the Ansible collection (plugins/module_utils/toml_writer.py), which the collection's containerd_runtime
module writes containerd's configs with on hosts that have no gpushare; the collection ships inside this package."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from gpushare.ansible_collections.gpushare.fleet.plugins.module_utils.toml_writer import encode_value
from gpushare.core.files import yaml_text


def templates_dir() -> Path:
    """The Jinja2 templates of every file NVIDIA's tools read: package data, never the workspace's."""
    return Path(__file__).resolve().parents[1] / "templates"


def _to_yaml(value: Any) -> str:
    return yaml_text(value).rstrip("\n")


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - renders YAML and TOML, never HTML
    )
    env.filters["to_yaml"] = _to_yaml
    env.filters["tomlv"] = encode_value
    return env
