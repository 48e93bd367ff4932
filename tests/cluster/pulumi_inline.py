"""One Pulumi operation on a workspace's stack with the real engine, run in a process of its own:

    python -m tests.cluster.pulumi_inline up|preview|refresh|destroy --stack S [--policy-pack EXE] [--out FILE]

The working directory is the workspace. The program is gpushare's (`gpushare.program.main.run`), handed to the
engine through the Automation API's inline mode: the Python SDK serves it as the language runtime and the CLI
connects to it (`pulumi <op> --client`), because the Python language host cannot be built from the module proxy
(docs/pulumi.md). Everything else is the real CLI and the real Kubernetes provider found on PATH. The answer (the
engine's summary, its output and the resources in the stack's state) is written as JSON to --out."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from pulumi import automation as auto


def inline_stack(name: str) -> auto.Stack:
    """The workspace's (the working directory's) stack, running gpushare's program inline."""
    from gpushare.program.main import run

    return auto.create_or_select_stack(
        stack_name=name, project_name="gpushare", program=run,
        opts=auto.LocalWorkspaceOptions(work_dir=str(Path.cwd()), secrets_provider="passphrase"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("op", choices=("up", "preview", "refresh", "destroy"))
    parser.add_argument("--stack", required=True)
    parser.add_argument("--policy-pack", action="append", default=[])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    stack = inline_stack(args.stack)
    lines: list[str] = []
    answer: dict[str, Any] = {"op": args.op}
    start = time.monotonic()
    try:
        if args.op == "up":
            up = stack.up(on_output=lines.append, policy_packs=args.policy_pack or None)
            answer.update(result=up.summary.result, changes=up.summary.resource_changes or {})
        elif args.op == "preview":
            preview = stack.preview(on_output=lines.append, policy_packs=args.policy_pack or None)
            answer.update(result="succeeded", changes=preview.change_summary)
        elif args.op == "refresh":
            # A refresh that only reports: what the server holds against the state, nothing written.
            refresh = stack.preview_refresh(on_output=lines.append)
            answer.update(result="succeeded", changes=refresh.change_summary)
        else:
            destroy = stack.destroy(on_output=lines.append)
            answer.update(result=destroy.summary.result, changes=destroy.summary.resource_changes or {})
    except auto.CommandError as err:
        answer.update(result="failed", error=str(err))
    answer["seconds"] = round(time.monotonic() - start, 1)
    answer["output"] = "".join(f"{line}\n" for line in lines)
    answer["resources"] = [
        {"type": r.get("type"), "urn": r.get("urn"), "id": r.get("id"), "inputs": r.get("inputs", {}),
         "outputs": r.get("outputs", {})}
        for r in (stack.export_stack().deployment or {}).get("resources", [])]
    Path(args.out).write_text(json.dumps(answer, indent=1, default=str))
    return 0 if answer["result"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
