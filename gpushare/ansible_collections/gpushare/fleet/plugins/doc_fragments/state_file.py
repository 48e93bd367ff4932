"""The option of the modules that read or record gpushare's state file on a host (host_read, dcgm_diag): documented
here once (`extends_documentation_fragment: gpushare.fleet.state_file`), specified once in module_utils/state.py
(STATE_PATH_OPTION), and held equal by tests/ansible/test_module_docs.py."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  state_path:
    description:
      - gpushare's state file on the host, the JSON object M(gpushare.fleet.gpushare_state) keeps (the roles use
        C(/var/lib/gpushare/state.json)). Omit to leave the file alone.
      - A file that is there but is not a JSON object (not JSON, a JSON list, a directory, not UTF-8) fails the task
        naming the host, the file and what is wrong, and is left as it is.
    type: path
"""
