"""The Pulumi program: `pulumi up -s <env>` loads the stack's environment file and resolves it.

This first version registers no cloud or Kubernetes resources yet (the NVIDIA stack, node pools and
monitoring components come with issue 3); it fails the preview on any invalid fleet and exports what
the fleet will provide, per pool and for the environment."""

from __future__ import annotations

from pathlib import Path

import pulumi

from gpushare.errors import GpushareError
from gpushare.resolve import project_root, resolve

config = pulumi.Config("gpushare")
env_file = Path(config.require("environment"))
if not env_file.is_absolute():
    env_file = project_root() / env_file

try:
    fleet = resolve(env_file)
except GpushareError as err:
    raise pulumi.RunError(f"environment {env_file} is invalid:\n{err}") from None

for pool in fleet.pools:
    pulumi.export(f"pool:{pool.name}", {"cluster": pool.cluster, "profile": pool.profile, **pool.totals.as_dict()})
pulumi.export("environment", {"name": fleet.environment, **fleet.totals.as_dict()})
