#!/usr/bin/python
"""Ansible module: add gpushare's rendered `nvidia` runtime to containerd through a drop-in, proving with
`containerd config dump` that nothing else in the effective configuration changes."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile
import tomllib

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpushare.fleet.plugins.module_utils.files import refuse_control_characters, write_if_differs
from ansible_collections.gpushare.fleet.plugins.module_utils.state import this_host
from ansible_collections.gpushare.fleet.plugins.module_utils.toml_writer import dumps, encode_key

DOCUMENTATION = r"""
module: containerd_runtime
author: gpushare maintainers (@gpushare)
short_description: Add the nvidia runtime to containerd through a drop-in, verified with containerd config dump
description:
  - Computes the effective configuration without the drop-in (the baseline), the drop-in to write, and the
    effective configuration with it, all with C(containerd config dump) before anything is written. Any
    difference other than the C(nvidia) runtime (and C(default_runtime_name) where O(allow_default_runtime)) is
    refused and nothing is written. After writing, the real dump must equal the predicted one.
  - containerd 1.x replaces a whole plugin table from an imported file, so for 1.x the drop-in carries the
    baseline's table of each plugin it touches (for example C(SystemdCgroup) of C(runc) and registry settings)
    with the rendered runtime merged in. containerd 2.x merges imported tables key by key and gets the rendered
    drop-in as it is.
  - Adds the drop-in to C(imports) of the main config when it is not imported yet.
  - Returns C(changed) when a file was (or in check mode would be) written; containerd then needs a restart.
  - Refuses, before anything is run or written, options that hold a control character (below 0x20, or 0x7f; in
    O(content), other than newlines and tabs) and O(content) that is not TOML; and before anything is written, a
    O(config_path) or O(dropin_path) that is a directory, not UTF-8, or (the main config) not TOML. Each fails the
    task naming the host, the option, the file and the line, and leaves every file as it was.
options:
  content:
    description: The rendered drop-in (TOML).
    type: str
    required: true
  dropin_path:
    description: Where the drop-in goes.
    type: path
    default: /etc/containerd/conf.d/99-gpushare-nvidia.toml
  config_path:
    description: containerd's main config file.
    type: path
    default: /etc/containerd/config.toml
  containerd:
    description: containerd executable.
    type: str
    default: containerd
  runtime_name:
    description: The runtime the drop-in adds.
    type: str
    default: nvidia
  allow_default_runtime:
    description: Whether C(default_runtime_name) may change (containerd without CDI needs nvidia as default).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Add the nvidia runtime gpushare rendered for this host (the inventory's gpushare_containerd_dropin)
  gpushare.fleet.containerd_runtime:
    content: "{{ gpushare_containerd_dropin }}"
  notify: Restart containerd

- name: Check only, changing nothing, that the drop-in is in place and alone in what it changes
  gpushare.fleet.containerd_runtime:
    content: "{{ gpushare_containerd_dropin }}"
    dropin_path: /etc/containerd/conf.d/99-gpushare-nvidia.toml
    config_path: /etc/containerd/config.toml
  check_mode: true
  register: dropin_check
  failed_when: dropin_check is failed or dropin_check is changed

- name: A containerd without CDI, where nvidia becomes the default runtime, with containerd from /opt
  gpushare.fleet.containerd_runtime:
    content: "{{ gpushare_containerd_dropin }}"
    containerd: /opt/containerd/bin/containerd
    allow_default_runtime: true
"""

RETURN = r"""
differences:
  description: "Effective-config keys the drop-in changes, as C(key: before -> after)."
  returned: always
  type: list
containerd_version:
  description: containerd's version (major.minor).
  returned: always
  type: str
"""


ARGUMENT_SPEC = {
    "content": {"type": "str", "required": True},
    "dropin_path": {"type": "path", "default": "/etc/containerd/conf.d/99-gpushare-nvidia.toml"},
    "config_path": {"type": "path", "default": "/etc/containerd/config.toml"},
    "containerd": {"type": "str", "default": "containerd"},
    "runtime_name": {"type": "str", "default": "nvidia"},
    "allow_default_runtime": {"type": "bool", "default": False},
}

HEADER = ("# containerd drop-in written by gpushare (Ansible role nvidia_container_toolkit): the rendered nvidia\n"
          "# runtime merged into this host's effective table, because containerd %s replaces whole plugin\n"
          "# tables from imported files. Do not edit; `containerd config dump` must differ only by the runtime.\n")


# TOML is written by module_utils.toml_writer (dumps), the encoder gpushare renders its TOML templates with.

# ---------------------------------------------------------------- pure logic (unit-tested)


def merge(base, extra):
    """Deep merge: tables merge key by key, everything else in `extra` wins."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def flatten(data, prefix=()):
    out = {}
    for key, value in data.items():
        path = prefix + (key,)
        if isinstance(value, dict) and value:
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out


def differences(before, after):
    """Effective-config keys that differ, ignoring `imports` (the drop-in itself is the one added import)."""
    flat_before = flatten({k: v for k, v in before.items() if k != "imports"})
    flat_after = flatten({k: v for k, v in after.items() if k != "imports"})
    keys = sorted(set(flat_before) | set(flat_after))
    return [(k, flat_before.get(k), flat_after.get(k)) for k in keys if flat_before.get(k) != flat_after.get(k)]


def disallowed(diffs, cri_plugins, runtime, allow_default_runtime):
    bad = []
    for key, old, new in diffs:
        if len(key) >= 5 and key[0] == "plugins" and key[1] in cri_plugins and key[2:5] == (
                "containerd", "runtimes", runtime):
            continue
        if allow_default_runtime and key[0] == "plugins" and key[1] in cri_plugins and key[2:] == (
                "containerd", "default_runtime_name"):
            continue
        bad.append((key, old, new))
    return bad


def desired_dropin(rendered_text, baseline, major):
    """The drop-in to write: the rendered one on containerd 2.x; on 1.x each plugin table it touches is the
    baseline's table with the rendered settings merged in, because 1.x replaces whole plugin tables."""
    if major >= 2:
        return rendered_text
    rendered = tomllib.loads(rendered_text)
    plugins = {name: merge(baseline.get("plugins", {}).get(name, {}), table)
               for name, table in rendered.get("plugins", {}).items()}
    data = {"version": rendered.get("version", 2), "plugins": plugins}
    return HEADER % ("1.x") + dumps(data)


def format_key(key):
    return ".".join(encode_key(str(p)) for p in key)


# ---------------------------------------------------------------- host side


class Containerd:
    def __init__(self, module):
        self.module = module
        self.binary = module.get_bin_path(module.params["containerd"], required=True)

    def version(self):
        rc, out, err = self.module.run_command([self.binary, "--version"])
        match = re.search(r"\sv?(\d+)\.(\d+)\.", out)
        if rc != 0 or not match:
            self.module.fail_json(msg="cannot read containerd's version: %s" % (err or out))
        return int(match.group(1)), int(match.group(2))

    def dump(self, config_path):
        cmd = [self.binary, "--config", config_path, "config", "dump"]
        rc, out, err = self.module.run_command(cmd)
        if rc != 0:
            self.module.fail_json(msg=f"host {this_host()}: containerd config dump failed for {config_path}: "
                                  f"{err.strip()}; nothing was written")
        return _toml(self.module, out, f"the output of `{' '.join(cmd)}`",
                     "run the command on the host: containerd prints its effective config as TOML; a wrapper or "
                     "a containerd that does not is not supported")


def expanded_imports(config, config_dir):
    out = []
    for pattern in config.get("imports", []):
        path = pattern if os.path.isabs(pattern) else os.path.join(config_dir, pattern)
        matches = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
        out.extend(m for m in matches if m not in out)
    return out


def add_import(text, dropin_path, version):
    """The main config's text with the drop-in added to `imports`, comments and layout kept."""
    match = re.search(r"(?ms)^imports\s*=\s*\[(.*?)\]", text)
    if match:
        items = [i.strip() for i in match.group(1).split(",") if i.strip()]
        items.append(json.dumps(dropin_path))
        return text[:match.start()] + "imports = [{}]".format(", ".join(items)) + text[match.end():]
    line = f"imports = [{json.dumps(dropin_path)}]\n"
    version_line = re.search(r"(?m)^version\s*=.*\n?", text)
    if version_line:
        end = version_line.end()
        prefix = text[:end] if text[:end].endswith("\n") else text[:end] + "\n"
        return prefix + line + text[end:]
    if not text.strip():
        return f"version = {version}\n{line}"
    return line + text


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    # The drop-in's text and the paths written into the main config's imports (and the files' names).
    refuse_control_characters(module, ("content", "dropin_path", "config_path", "containerd", "runtime_name"),
                              "containerd's drop-in and config values", allow={"content": "\n\t"})
    rendered = _toml(module, p["content"], "option content",
                     "give the drop-in gpushare rendered (the role's nvidia_container_toolkit_containerd_dropin)")
    containerd = Containerd(module)
    major, minor = containerd.version()
    cri_plugins = set(rendered.get("plugins", {}))

    config_text = _read_text(module, p["config_path"], "config_path")
    config = _toml(module, config_text, f"option config_path: {p['config_path']}",
                   "repair the file so containerd reads it (`containerd config dump` shows where it stops), or "
                   "restore the host's packaged config") if config_text.strip() else {
        "version": rendered.get("version", 2)}
    config_dir = os.path.dirname(p["config_path"])
    others = [i for i in expanded_imports(config, config_dir) if i != p["dropin_path"]]

    work = tempfile.mkdtemp(prefix="gpushare-containerd-")
    try:
        base_cfg = os.path.join(work, "baseline.toml")
        with open(base_cfg, "w") as handle:
            handle.write(dumps(merge(config, {"imports": others})))
        baseline = containerd.dump(base_cfg)

        dropin_text = desired_dropin(p["content"], baseline, major)
        tmp_dropin = os.path.join(work, "dropin.toml")
        with open(tmp_dropin, "w") as handle:
            handle.write(dropin_text)
        predicted_cfg = os.path.join(work, "predicted.toml")
        with open(predicted_cfg, "w") as handle:
            handle.write(dumps(merge(config, {"imports": others + [tmp_dropin]})))
        predicted = containerd.dump(predicted_cfg)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    diffs = differences(baseline, predicted)
    shown = [f"{format_key(k)}: {json.dumps(o)} -> {json.dumps(n)}" for k, o, n in diffs]
    bad = disallowed(diffs, cri_plugins, p["runtime_name"], p["allow_default_runtime"])
    if bad:
        module.fail_json(msg="the drop-in would change containerd settings other than the {} runtime; nothing "
                         "was written: {}".format(p["runtime_name"], "; ".join(
                             f"{format_key(k)}: {json.dumps(o)} -> {json.dumps(n)}" for k, o, n in bad)),
                         differences=shown)
    if not any(k[0] == "plugins" and k[2:5] == ("containerd", "runtimes", p["runtime_name"]) for k, _, _ in diffs) \
            and not _has_runtime(baseline, cri_plugins, p["runtime_name"]):
        module.fail_json(msg=f"the drop-in adds no {p['runtime_name']} runtime to containerd's effective config",
                         differences=shown)

    current_dropin = _read_text(module, p["dropin_path"], "dropin_path", missing=None)
    imported = p["dropin_path"] in expanded_imports(config, config_dir)
    new_config_text = config_text if imported else add_import(config_text, p["dropin_path"],
                                                              rendered.get("version", 2))
    changed = current_dropin != dropin_text or new_config_text != config_text

    if changed and not module.check_mode:
        # Atomic (a temporary file renamed over the old one), mode 0644, directories created 0755.
        write_if_differs(p["dropin_path"], dropin_text.encode())
        if new_config_text != config_text:
            write_if_differs(p["config_path"], new_config_text.encode())
    if changed and not module.check_mode:  # unchanged files: the effective config is the prediction
        after = containerd.dump(p["config_path"])
        mismatch = differences(predicted, after)
        if mismatch:
            shown_after = [f"{format_key(k)}: {json.dumps(o)} -> {json.dumps(n)}" for k, o, n in mismatch]
            module.fail_json(msg="containerd's effective config after writing differs from the prediction: "
                             + "; ".join(shown_after), differences=shown)
    module.exit_json(changed=changed, differences=shown, containerd_version=f"{major}.{minor}",
                     dropin=dropin_text, diff={"before": current_dropin or "", "after": dropin_text})


def _toml(module, text, what, fix):
    """`text` read as TOML; the task fails naming the host, `what` it is and the line where it stops."""
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as err:
        module.fail_json(msg=f"host {this_host()}: {what} is not TOML: {err}; nothing was written (fix: {fix})")


def _read_text(module, path, option, missing=""):
    """The text of the file at `path` (the option `option` names it); `missing` where there is none. The task
    fails, before anything is written, where it is a directory or other non-file, unreadable or not UTF-8."""
    if not os.path.lexists(path):
        return missing
    if os.path.isdir(path) or (os.path.exists(path) and not os.path.isfile(path)):
        kind = "a directory" if os.path.isdir(path) else "not a regular file"
        module.fail_json(msg=f"host {this_host()}: option {option}: {path} is {kind}; nothing was written (fix: "
                         f"give {option} the file's own path, or move what is there aside)")
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as err:
        module.fail_json(msg=f"host {this_host()}: option {option}: cannot read {path}: {err.strerror or err}; "
                         "nothing was written (fix: check the path and its permissions)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        module.fail_json(msg=f"host {this_host()}: option {option}: {path}:{line}: not UTF-8: byte "
                         f"0x{raw[err.start]:02x} at offset {err.start}; containerd reads TOML as UTF-8; nothing "
                         "was written (fix: save the file as UTF-8)")


def _has_runtime(config, plugins, runtime):
    return any(runtime in config.get("plugins", {}).get(p, {}).get("containerd", {}).get("runtimes", {})
               for p in plugins)



if __name__ == "__main__":
    main()
