"""The Pulumi program of this workspace (Pulumi.yaml: main: infra/): gpushare's program, from the installed package."""
from gpushare.program.main import run

run()
