"""Site settings beside an environment file: the Ansible variables in its group_vars/ and host_vars/ (package mirrors,
suites, signing keys, paths, versions), which the collection's roles write into line-based files on the hosts (apt
sources, a systemd unit drop-in, containerd's TOML, CDI specs). `gpushare validate` reads them before Ansible does and
refuses a control character in any of the collection's variables, naming the file, the line, the variable and the
fix: a newline in a mirror URI would add `Trusted: yes` to the apt source and turn its signature checks off. The
collection's modules refuse the same at run time (module_utils/files.py), for values set anywhere else."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.loading import Located
from gpushare.core.paths import package_collection
from gpushare.core.reading import read_text

# Variables that hold a whole file's text (rendered by gpushare): newlines and tabs are their lines and indents.
FILE_TEXT_VARIABLES = frozenset({
    "mig_parted_config", "nvidia_container_toolkit_config", "nvidia_container_toolkit_containerd_dropin",
    "gpushare_mig_parted_config", "gpushare_toolkit_config", "gpushare_containerd_dropin",
    "gpushare_device_plugin_config_content"})
# Where a variable's value ends up, by a part of its name, for the message (first match).
_DESTINATIONS = (
    ("apt_", "the apt source (a deb822 .sources file) the role writes"),
    ("mig_", "the nvidia-mig-manager unit drop-in or the mig-parted config the role writes"),
    ("containerd", "containerd's config files the role writes"),
    ("cdi", "the CDI spec the role writes"),
)
_SUFFIXES = ("", ".yml", ".yaml", ".json")  # the files Ansible reads in group_vars/ and host_vars/


@cache
def collection_variables() -> frozenset[str]:
    """The variables of the collection's roles, as their argument specs list them."""
    names: set[str] = set()
    for spec in sorted(package_collection("roles").glob("*/meta/argument_specs.yml")):
        for entry in (yaml.safe_load(spec.read_text()) or {}).get("argument_specs", {}).values():
            names.update((entry or {}).get("options") or {})
    return frozenset(names)


def checked(name: Any) -> bool:
    return isinstance(name, str) and (name in collection_variables() or name.startswith("gpushare_"))


def _control_character(text: str, allow: str) -> tuple[int, str] | None:
    for index, char in enumerate(text):
        if (char < " " or char == "\x7f") and char not in allow:
            return index, char
    return None


def _describe(char: str) -> str:
    names = {"\n": "line feed", "\r": "carriage return", "\t": "tab", "\x00": "NUL", "\x1b": "escape",
             "\x7f": "delete"}
    return f"{char!r} (U+{ord(char):04X}{', ' + names[char] if char in names else ''})"


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML as Ansible writes it: `!unsafe` text is text (checked), `!vault` and other tags hold nothing to check."""


def _tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if suffix == "unsafe" and isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    return None


_Loader.add_multi_constructor("!", _tagged)


def _files(env_file: Path) -> list[Path]:
    out = []
    for folder in ("group_vars", "host_vars"):
        base = env_file.parent / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if path.is_file() and path.suffix in _SUFFIXES and not path.name.startswith(".") \
                    and not any(part.startswith(".") for part in path.relative_to(base).parts):
                out.append(path)
    return out


def _walk(value: Any, loc: tuple[Any, ...], allow: str, seen: set[int]) -> list[tuple[tuple[Any, ...], str, int, str]]:
    """(location, text, index, character) of each string holding a control character; a shared value (a YAML
    alias) is walked once."""
    if isinstance(value, str):
        found = _control_character(value, allow)
        return [] if found is None else [(loc, value, *found)]
    if not isinstance(value, (dict, list)) or id(value) in seen:
        return []
    seen.add(id(value))
    items = value.items() if isinstance(value, dict) else enumerate(value)
    out = []
    for key, item in items:
        if isinstance(key, str) and (found := _control_character(key, "")) is not None:
            out.append(((*loc, key), key, *found))
        out.extend(_walk(item, (*loc, key), allow, seen))
    return out


def _destination(name: str) -> str:
    return next((text for part, text in _DESTINATIONS if part in name), "the files and settings the role writes")


def site_vars_problems(env_file: Path) -> tuple[list[Problem], list[str]]:
    """Problems with the site settings beside `env_file` (a control character in one of the collection's
    variables), and warnings for files that could not be read (not checked)."""
    problems: list[Problem] = []
    warnings: list[str] = []
    for path in _files(env_file):
        try:
            text = read_text(path, "Ansible variables file")
            data = yaml.load(text, Loader=_Loader)  # a safe loader (CSafeLoader), Ansible's tags read as above
        except (GpushareError, yaml.YAMLError, RecursionError) as err:
            reason = "; ".join(p.message for p in err.problems) if isinstance(err, GpushareError) else \
                str(err).splitlines()[0] if str(err) else type(err).__name__
            warnings.append(f"{path}: not read ({reason}), so its values were not checked for control characters")
            continue
        if not isinstance(data, dict):
            continue
        doc = Located(str(path), data, text)
        seen: set[int] = set()
        for name, value in data.items():
            if not checked(name):
                continue
            allow = "\n\t" if name in FILE_TEXT_VARIABLES else ""
            for loc, shown, index, char in _walk(value, (name,), allow, seen):
                quoted = repr(shown if len(shown) <= 80 else shown[:77] + "...")
                problems.append(doc.problem(
                    loc, f"{quoted} holds the control character {_describe(char)} at position {index}, which would "
                    f"start a line of its own in {_destination(name)}",
                    fix="write the value on one line of printable text: a URI, suite, key URL, path, name or "
                        "version never holds a control character (in YAML, no \\n, \\r or \\t escape in quotes)"))
    return problems, warnings


def check_site_vars(env_file: Path) -> list[str]:
    """Raise the problems of `site_vars_problems` (exit 1, like the environment file's own); return its warnings."""
    problems, warnings = site_vars_problems(env_file)
    if problems:
        raise GpushareError(problems)
    return warnings
