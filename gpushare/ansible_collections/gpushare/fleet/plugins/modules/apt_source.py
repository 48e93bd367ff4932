#!/usr/bin/python
"""Ansible module: one apt source for NVIDIA packages (a deb822 .sources file and its signing key), in one task."""

from __future__ import annotations

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url
from ansible_collections.gpushare.fleet.plugins.module_utils.files import (
    differs,
    refuse_control_characters,
    write_if_differs,
)

DOCUMENTATION = r"""
module: apt_source
author: gpushare maintainers (@gpushare)
short_description: One apt source for NVIDIA packages, with its signing key
description:
  - Writes C(/etc/apt/sources.list.d/<name>.sources) (deb822) when it differs, and fetches the signing key into
    C(/etc/apt/keyrings/<name>.asc) when that file is absent. Reports changed when either was written, so the task
    that installs packages from the source refreshes the package index only then (C(update_cache) of
    M(ansible.builtin.apt)).
  - One task instead of a check, a key download, a file write and a handler (each a task result the controller pays
    for, per host).
  - Every option is refused, before anything is fetched or written, when it holds a control character (below 0x20,
    or 0x7f), since a newline in O(uri) or O(suite) would start a field of its own in the deb822 file, such as a
    C(Trusted) field set to C(yes), which turns signature checks off for the source.
options:
  name:
    description: File name under C(/etc/apt/sources.list.d/), without C(.sources); lower case letters, digits, dots
      and dashes.
    type: str
    required: true
  uri:
    description: "Repository URI (NVIDIA's or the site's mirror): file, http and https URIs all work."
    type: str
    required: true
  suite:
    description: Suite; C(/) for NVIDIA's flat repositories.
    type: str
    default: /
  components:
    description: Components; empty for a flat repository.
    type: list
    elements: str
    default: []
  key_url:
    description: URL of the repository's signing key (ASCII-armoured); empty with O(trusted).
    type: str
    default: ""
  trusted:
    description: Trust the source without a signature (an internal mirror only; prefer a key).
    type: bool
    default: false
  sources_dir:
    description: Where apt reads sources from.
    type: path
    default: /etc/apt/sources.list.d
  keyrings_dir:
    description: Where the signing key is kept.
    type: path
    default: /etc/apt/keyrings
"""

EXAMPLES = r"""
- name: NVIDIA's container toolkit repository, with its signing key
  gpushare.fleet.apt_source:
    name: nvidia-container-toolkit
    uri: https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)
    key_url: https://nvidia.github.io/libnvidia-container/gpgkey
  register: toolkit_source

- name: Install from it, refreshing the package index only when the source or its key was written
  ansible.builtin.apt:
    name: nvidia-container-toolkit
    update_cache: "{{ toolkit_source is changed }}"

- name: The site's unsigned mirror of NVIDIA's CUDA repository (DCGM), with a component
  gpushare.fleet.apt_source:
    name: nvidia-dcgm
    uri: http://mirror.example.internal/cuda/debian12/x86_64
    suite: stable
    components: [main]
    trusted: true
"""

RETURN = r"""
path:
  description: The .sources file.
  returned: always
  type: str
key_path:
  description: The signing key's file, when a key URL is given.
  returned: when key_url is given
  type: str
"""

ARGUMENT_SPEC = {
    "name": {"type": "str", "required": True},
    "uri": {"type": "str", "required": True},
    "suite": {"type": "str", "default": "/"},
    "components": {"type": "list", "elements": "str", "default": []},
    "key_url": {"type": "str", "default": "", "no_log": False},
    "trusted": {"type": "bool", "default": False},
    "sources_dir": {"type": "path", "default": "/etc/apt/sources.list.d"},
    "keyrings_dir": {"type": "path", "default": "/etc/apt/keyrings"},
}

NAME = re.compile(r"^[a-z0-9][a-z0-9.-]*$")


def render(params, key_path):
    """The deb822 source: the URI and suite, and the key that signs it or Trusted for an unsigned mirror."""
    lines = ["# Managed by gpushare (Ansible module gpushare.fleet.apt_source).", "Types: deb",
             f"URIs: {params['uri']}", f"Suites: {params['suite']}"]
    if params["components"]:
        lines.append("Components: " + " ".join(params["components"]))
    lines.append("Trusted: yes" if params["trusted"] else f"Signed-By: {key_path}")
    return "\n".join(lines) + "\n"


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    # Before anything else: every value here ends up in the deb822 file or in a path or URL it names.
    refuse_control_characters(module, ("name", "uri", "suite", "components", "key_url", "sources_dir",
                                       "keyrings_dir"), "an apt source's values (its deb822 file, paths and key URL)")
    if not NAME.fullmatch(p["name"]):
        module.fail_json(msg=f"apt source name {p['name']!r}: use lower case letters, digits, dots and dashes "
                         "(it names the file under sources.list.d)")
    if not p["uri"].strip():
        module.fail_json(msg=f"apt source {p['name']}: give the repository URI")
    if not p["trusted"] and not p["key_url"]:
        module.fail_json(msg=f"apt source {p['name']}: give a signing key URL, or trusted=true for an unsigned site "
                         "mirror")
    path = os.path.join(p["sources_dir"], f"{p['name']}.sources")
    key_path = os.path.join(p["keyrings_dir"], f"{p['name']}.asc")
    result = {"path": path}
    changed = False
    if p["key_url"]:
        result["key_path"] = key_path
        if not os.path.exists(key_path):
            changed = True
            if not module.check_mode:
                response, info = fetch_url(module, p["key_url"], timeout=60)
                if info.get("status") not in (200, None) or response is None:
                    module.fail_json(msg=f"apt source {p['name']}: could not fetch the signing key {p['key_url']}: "
                                     f"{info.get('msg', 'no answer')} (status {info.get('status')})")
                key = response.read()
                if b"PGP PUBLIC KEY BLOCK" not in key and not key.startswith(b"\x99"):
                    module.fail_json(msg=f"apt source {p['name']}: {p['key_url']} did not answer with an OpenPGP "
                                     "key; check the URL or the site's proxy")
                write_if_differs(key_path, key)
    content = render(p, key_path).encode()
    if module.check_mode:
        changed = changed or differs(path, content)
    else:
        changed = write_if_differs(path, content) or changed
    module.exit_json(changed=changed, **result)


if __name__ == "__main__":
    main()
