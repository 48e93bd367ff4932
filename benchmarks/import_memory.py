"""How much memory does `gpushare import` take for a large cluster dump, against the dump's size?

Run: python benchmarks/import_memory.py [--mb 50] [--repeat 1]. Writes a `kubectl get nodes -o yaml
--show-managed-fields` dump of GPU nodes shaped as a real cluster's (GFD labels, node images, managedFields: about
15 KB a node) of about --mb MB beside the ClusterPolicy and ConfigMaps of the test fixture `default-operator`, runs
`gpushare import` on it in a fresh process, and prints that process's peak resident memory (ru_maxrss of the child),
the same for a run on the fixture's own small dump (the cost of starting gpushare and importing its libraries), and
the ratio (peak - start-up) / dump size: the memory each byte of dump costs. Target: the ratio at most 10, so a
50 MB dump imports in well under 1 GiB. Not a timed test: figures go to benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "brownfield" / "default-operator"
RATIO_TARGET = 10.0
NODE_BYTES = 15_300  # what node() below writes, measured


def node(i: int) -> dict[str, Any]:
    """One GPU node as kubectl writes it: GPU Feature Discovery's labels, the images the kubelet reports and the
    managedFields of the labels."""
    name = f"gpu-{i:05d}"
    labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true",
              "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8",
              "nvidia.com/mig.config": "all-disabled", "nvidia.com/mig.config.state": "success",
              "nvidia.com/cuda.driver.major": "570"}
    labels.update({f"feature.node.kubernetes.io/cpu-cpuid.F{k}": "true" for k in range(60)})
    managed = {"f:metadata": {"f:labels": {f"f:{key}": {} for key in labels}}}
    images = [{"names": [f"nvcr.io/nvidia/k8s/image-{k}@sha256:{'a' * 64}", f"nvcr.io/nvidia/k8s/image-{k}:v1.{k}"],
               "sizeBytes": 123_456_789 + k} for k in range(40)]
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": labels,
        "managedFields": [{"manager": "gpu-feature-discovery", "operation": "Update", "time": "2026-12-01T10:00:00Z",
                           "fieldsV1": managed}]},
        "spec": {}, "status": {
            "addresses": [{"type": "InternalIP", "address": f"10.{40 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}"}],
            "capacity": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "127", "memory": "1000Gi", "nvidia.com/gpu": "8"},
            "images": images,
            "nodeInfo": {"kubeletVersion": "v1.31.4", "osImage": "Ubuntu 24.04.2 LTS"}}}


def write_dump(folder: Path, megabytes: float) -> int:
    """The fixture's dumps with nodes.yaml replaced by about `megabytes` MB of nodes; the file's size."""
    import yaml

    shutil.copytree(FIXTURE, folder)
    count = max(1, int(megabytes * 1_000_000 / NODE_BYTES))
    with open(folder / "nodes.yaml", "w") as handle:
        yaml.dump({"apiVersion": "v1", "kind": "List", "items": [node(i) for i in range(count)]}, handle,
                  Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))
    return (folder / "nodes.yaml").stat().st_size


def run_import(dumps: Path, work: Path) -> tuple[int, float, int]:
    """(peak resident bytes, seconds, exit code) of `gpushare import` from `dumps` into a new workspace, measured
    in a child process of its own (ru_maxrss of RUSAGE_CHILDREN holds the largest child's peak, so each run gets
    a fresh helper process that reports its one child)."""
    workspace = work / f"ws-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep)}
    subprocess.run([sys.executable, "-m", "gpushare", "init", str(workspace)], check=True, capture_output=True,
                   env=env, cwd=work)
    probe = (
        "import resource, subprocess, sys, time, json\n"
        "t = time.monotonic()\n"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024\n"
        "print(json.dumps([peak, time.monotonic() - t, done.returncode, done.stderr[-2000:]]))\n")
    out = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "gpushare", "import", "--from",
                          str(dumps), "--env", "big", "--out", str(workspace), "--json"],
                         capture_output=True, text=True, check=True, env=env, cwd=work)
    peak, seconds, code, stderr = json.loads(out.stdout)
    if code not in (0, 1):
        raise SystemExit(f"gpushare import exited {code}: {stderr}")
    return int(peak), float(seconds), int(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0, help="size of the node dump in MB (default 50)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the large import (default 1)")
    args = parser.parse_args()
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >= 0
    with tempfile.TemporaryDirectory(prefix="gpushare-import-memory-") as tmp:
        work = Path(tmp)
        small_peak, small_s, _ = run_import(FIXTURE, work)
        size = write_dump(work / "dumps", args.mb)
        runs = [run_import(work / "dumps", work) for _ in range(args.repeat)]
    mib = 1024 * 1024
    print(f"start-up (the fixture's {sum(p.stat().st_size for p in FIXTURE.glob('*.yaml')) // 1024} KB dump): "
          f"peak {small_peak / mib:.0f} MiB in {small_s:.1f} s")
    for peak, seconds, code in runs:
        ratio = (peak - small_peak) / size
        print(f"{size / 1e6:.1f} MB dump: peak {peak / mib:.0f} MiB in {seconds:.1f} s (exit {code}); "
              f"(peak - start-up) / dump size = {ratio:.1f} (target <= {RATIO_TARGET:g})")


if __name__ == "__main__":
    main()
