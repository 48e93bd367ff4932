"""Ansible benchmark: `site.yml` against 1, 4 and 8 isolated test hosts (tests/ansible/testbed.py: debootstrap'd
Debian booted with systemd-nspawn, simulated GPUs), forks >= 8, each host set fresh; then a converged rerun on the
8 hosts. Prints the wall-time ratio of 8 hosts to 1 (target <= 3.0) and of the converged rerun to the first run
(target <= 0.5). Needs root, like the Ansible tests; nothing here is a pass/fail test.

    python benchmarks/ansible_site.py [--sizes 1,4,8] [--forks 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.ansible.controller import ENVIRONMENTS, Controller  # noqa: E402 - after the path set-up
from tests.ansible.testbed import HostSpec, Testbed  # noqa: E402

# Host i gets the i-th model of this cycle (the three pools of the testbed environment).
CYCLE = [
    ("a100-inference", "NVIDIA A100-SXM4-80GB", 8, True),
    ("h100-llm-serving", "NVIDIA H100 80GB HBM3", 8, True),
    ("l4-notebooks", "NVIDIA L4", 4, False),
]


def host_specs(count: int) -> list[HostSpec]:
    """`count` hosts spread over the testbed environment's pools (A100 x8, H100 x8, L4 x4, A100 x8, ...)."""
    return [HostSpec(f"bench-{i + 1:02d}", model, gpus, nvswitch=nvswitch)
            for i, (_, model, gpus, nvswitch) in enumerate(CYCLE[i % len(CYCLE)] for i in range(count))]


def environment(bed: Testbed, directory: Path) -> Path:
    """The testbed environment with the benchmark's hosts (at the addresses they got) in its pools."""
    data = yaml.safe_load((ENVIRONMENTS / "testbed.yaml").read_text())
    data["name"] = f"bench{len(bed.hosts)}"
    pools = {p["name"]: p for p in data["pools"]}
    for pool in pools.values():
        pool["hosts"] = []
    for i, host in enumerate(bed.hosts):
        pool = CYCLE[i % len(CYCLE)][0]
        pools[pool]["hosts"].append({"name": host.name, "address": host.address, "gpu_count": host.spec.gpu_count,
                                     "nvswitch": host.spec.nvswitch})
    data["pools"] = [p for p in data["pools"] if p["hosts"]]
    advertised = {"a100-inference": "nvidia.com/mig-3g.40gb", "l4-notebooks": "nvidia.com/gpu.shared"}
    present = {advertised[p["name"]] for p in data["pools"] if p["name"] in advertised}
    data["tenants"] = [t for t in data["tenants"] if set(t["quota"]) <= present]
    env_dir = directory / "environments"
    (env_dir / "group_vars").mkdir(parents=True, exist_ok=True)
    (env_dir / "group_vars" / "all.yml").write_text((ENVIRONMENTS / "group_vars" / "all.yml").read_text())
    path = env_dir / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def measure(count: int, forks: int, rerun: bool) -> tuple[float, float | None]:
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp, \
            Testbed(host_specs(count), tag=f"bench{count}") as bed:
        env = environment(bed, Path(tmp))
        ctl = Controller(Path(tmp) / "controller", bed.hosts[0].key, forks=forks)
        ctl.seed_nodes({h.name: {"kubernetes.io/hostname": h.name} for h in bed.hosts})
        t0 = time.perf_counter()
        first = ctl.run("site.yml", env, label=f"bench{count}-first")
        first_s = time.perf_counter() - t0
        if first.rc != 0:
            raise SystemExit(f"site.yml failed on {count} hosts: {first.summary()}")
        again_s = None
        if rerun:
            t0 = time.perf_counter()
            again = ctl.run("site.yml", env, label=f"bench{count}-rerun")
            again_s = time.perf_counter() - t0
            changed = sum(again.changed(h.name) for h in bed.hosts)
            if again.rc != 0 or changed:
                raise SystemExit(f"the rerun was not converged (changed={changed}): {again.summary()}")
        return first_s, again_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,4,8")
    parser.add_argument("--forks", type=int, default=10)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (systemd-nspawn, network namespaces), like the Ansible tests")
    sizes = [int(s) for s in args.sizes.split(",")]
    first: dict[int, float] = {}
    rerun_s = None
    for count in sizes:
        seconds, again = measure(count, max(args.forks, 8), rerun=count == max(sizes))
        first[count] = seconds
        print(f"site.yml, {count} fresh host(s): {seconds:6.1f} s", flush=True)
        if again is not None:
            rerun_s = again
            print(f"site.yml, {count} converged host(s) (rerun, changed=0): {again:6.1f} s", flush=True)
    load = os.getloadavg()[0]
    print(f"load average at the end: {load:.1f} on {os.cpu_count()} CPUs")
    small, large = min(sizes), max(sizes)
    if small != large:
        ratio = first[large] / first[small]
        print(f"ratio {large} hosts / {small} host: {ratio:.2f} (target <= 3.0: {'met' if ratio <= 3.0 else 'missed'})")
    if rerun_s is not None:
        ratio = rerun_s / first[large]
        print(f"ratio converged rerun / first run ({large} hosts): {ratio:.2f} "
              f"(target <= 0.5: {'met' if ratio <= 0.5 else 'missed'})")


if __name__ == "__main__":
    main()
