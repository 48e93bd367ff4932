"""Ansible filter: gpushare's exact MIG layout check, run on the controller inside the task that uses it.

The check of `gpushare mig validate`, without starting it: a command per MIG host would cost a Python start (about
0.2 s of CPU) and a task result of its own. The filter runs in the worker that templates the mig role's assert, where
gpushare is already imported and its catalog read when the inventory is gpushare's (workers are forks of the process
that read it).
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: mig_layout_check
short_description: gpushare's exact MIG layout check for one GPU model
description:
  - The check of C(gpushare mig validate) (profiles, counts, slices, media engines, driver minimums, placements),
    for a GPU model by NVML name, a layout as C(3g.40gb=1,1g.10gb=2), and the host's driver branch.
  - Returns C(ok), C(errors) and C(warnings); a model or layout gpushare cannot read is an error, not an exception.
positional: layout, driver_branch
options:
  _input: {description: GPU model (NVML name)., type: str, required: true}
  layout: {description: The layout per GPU., type: str, required: true}
  driver_branch: {description: Driver branch of the host (580 for 580.x)., type: int}
"""


def mig_layout_check(model: str, layout: str, driver_branch: Any = None) -> dict[str, Any]:
    try:
        from gpushare.core.catalog import load_catalog
        from gpushare.core.errors import GpushareError
        from gpushare.core.mig import check_layout, parse_layout
    except ImportError as err:
        raise AnsibleFilterError(f"gpushare.fleet.mig_layout_check needs gpushare in the Python that runs Ansible "
                                 f"({err}); fix: pip install gpushare there") from None
    try:
        branch = int(driver_branch) if driver_branch not in (None, "") else None
        check = check_layout(load_catalog().lookup(str(model)), parse_layout(str(layout)), branch)
    except GpushareError as err:
        return {"ok": False, "errors": [str(p) for p in err.problems], "warnings": []}
    except ValueError as err:
        return {"ok": False, "errors": [f"driver branch {driver_branch!r}: {err}"], "warnings": []}
    return {"ok": check.ok, "errors": list(check.errors), "warnings": list(check.warnings)}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"mig_layout_check": mig_layout_check}
