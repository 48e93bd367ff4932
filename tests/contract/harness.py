"""The bad-input contract's harness: a throwaway workspace, a gpushare worker process under an address-space
limit (tests/contract/worker.py), and a snapshot of every file outside the output paths."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SEEDS = Path(__file__).resolve().parent / "seeds"
WORKER = Path(__file__).resolve().parent / "worker.py"

# The address-space cap of the worker. Measured here (2026-12): numpy, HiGHS, matplotlib and the Pulumi SDK
# reserve about 0.25 GiB at import and the Pulumi mock engine's threads take a run to about 0.75 GiB; the layout
# bug this guards against grew past 2 GiB. 1.5 GiB leaves room for every real command and none for a runaway one.
LIMIT_BYTES = 1536 * 1024 * 1024
EXIT_CODES = {0, 1, 2, 3}  # documented: ok, invalid input or a failed check, unusable input, no GPU
OUTPUTS = ("out", "build")  # where commands write by default
OUTPUT_OPTIONS = ("--out", "--env-out", "--patch", "--chart", "--journal")  # and where the user tells them to


@dataclass
class Result:
    code: int | str
    stdout: str
    stderr: str
    vmpeak: int

    @property
    def text(self) -> str:
        return self.stdout + self.stderr


class Worker:
    """One long-lived gpushare process: each request is a command line run through gpushare's own `main`."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        env = {**os.environ, "GPUSHARE_ROOT": str(workspace), "PYTHONPATH": str(ROOT)}
        env.pop("GPUSHARE_DEBUG", None)
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), str(LIMIT_BYTES)], cwd=workspace, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.ready = json.loads(self._read())

    def _read(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=30)
            assert self.process.stderr is not None
            raise AssertionError(f"the gpushare worker died (exit {self.process.returncode}): "
                                 f"{self.process.stderr.read()[-3000:]}")
        return line

    def run(self, args: list[str]) -> Result:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"args": args}) + "\n")
        self.process.stdin.flush()
        data = json.loads(self._read())
        ws = str(self.workspace)
        return Result(data["code"], data["stdout"].replace(ws, "."), data["stderr"].replace(ws, "."),
                      data["vmpeak"])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def make_workspace(path: Path) -> Path:
    """What a fleet repository holds, copied from this checkout, plus the frozen seeds under inputs/."""
    for name in ("environments", "profiles", "policies", "infra", "examples"):
        shutil.copytree(ROOT / name, path / name, ignore=shutil.ignore_patterns("__pycache__", "waivers.yaml"))
    shutil.copytree(ROOT / "gpushare" / "data", path / "gpushare" / "data")
    for stack in [*ROOT.glob("Pulumi*.yaml"), ROOT / "gpushare.yaml"]:
        shutil.copy(stack, path / stack.name)
    (path / "inputs" / "profiles").mkdir(parents=True)
    for profile in (ROOT / "profiles").glob("*.yaml"):
        shutil.copy(profile, path / "inputs" / "profiles" / profile.name)
    os.mkfifo(path / "inputs" / "fifo.yaml")
    (path / "inputs" / "dir.yaml").mkdir()
    return path


def snapshot(workspace: Path) -> dict[str, str]:
    """Every file outside the output paths, by content."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(workspace):
        rel_dir = Path(dirpath).relative_to(workspace)
        if rel_dir.parts and rel_dir.parts[0] in OUTPUTS:
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(workspace))
            if path.is_fifo() or rel.startswith("inputs/"):
                continue  # the test writes inputs/ itself
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def assert_contract(result: Result, args: list[str], before: dict[str, str], after: dict[str, str]) -> None:
    """Exit code in the documented set, no traceback or internal error, a fix for every failure, nothing
    changed outside the output paths."""
    shown = " ".join(args)
    assert result.code in EXIT_CODES, f"gpushare {shown}: exit {result.code}\n{result.text[-3000:]}"
    assert "Traceback" not in result.text, f"gpushare {shown}: a traceback\n{result.text[-3000:]}"
    assert "internal error" not in result.text, f"gpushare {shown}:\n{result.text[-3000:]}"
    if result.code != 0:
        # A usage error (Click: unknown option, a value out of an option's range) points at --help instead.
        hint = "fix" in result.text.lower() or (result.code == 2 and "--help' for help" in result.text)
        assert hint, f"gpushare {shown}: exit {result.code} without a fix\n{result.text}"
    if "--json" in args and result.stdout.strip():
        document = json.loads(result.stdout)
        assert isinstance(document, dict) and document.get("ok") is (result.code == 0), (shown, document)
    named = [os.path.normpath(args[i + 1]) for i, a in enumerate(args[:-1]) if a in OUTPUT_OPTIONS]
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k)
                     and not any(n == "." or k == n or k.startswith(n + "/") for n in named))
    assert not changed, f"gpushare {shown} changed files outside its output: {changed}"


def write_input(workspace: Path, name: str, data: bytes) -> str:
    path = workspace / "inputs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(Path("inputs") / name)


def seed(name: str) -> bytes:
    return (SEEDS / name).read_bytes()


def as_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)
