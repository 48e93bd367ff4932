"""The demand file: which workloads need how much GPU, how isolated, how latency-sensitive, and which GPU models
may serve them. `gpushare pack` turns it into per-GPU layouts (gpushare/pack.py).

Unknown keys are errors, and every error names the file, the line, the path and the fix, as for environment
files (the loading helpers are gpushare.spec's)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.guardrails import DEFAULT_CONTEXT_RESERVE_GIB
from gpushare.core.loading import Located, Strict, file_body, invalid, read_yaml, validation_problems
from gpushare.core.spec import NAME_PATTERN

Kind = Literal["online", "batch", "dev"]
Latency = Literal["high", "medium", "low"]

# Default latency sensitivity by kind: online services tolerate MPS (concurrent, partitioned) but not the
# scheduling gaps of time-slicing; batch and development work tolerates both.
DEFAULT_LATENCY: dict[str, Latency] = {"online": "medium", "batch": "low", "dev": "low"}
# R580 is NVIDIA's current long-term support branch; without --env the plan assumes it (docs/pack.md).
DEFAULT_DRIVER_BRANCH = 580


class GpuSupply(Strict):
    model: str = Field(description="GPU model: NVML name, alias, slug, GKE accelerator name or PCI id.")
    count: int | None = Field(None, ge=0, le=100_000,
                              description="GPUs of this model available; absent: as many as needed.")
    cost: float = Field(1.0, gt=0, description="Relative cost of one GPU of this model (objective: cost).")


# Replicas of all workloads in one demand. Measured (benchmarks/planner/scale.py): 204,800 replicas pack in 4.2 s
# with 318 MiB on a 2-core machine, checks and output included; 1.7 million took 121 s and 8.5 GiB, a plan of
# 400,000 GPUs that no site runs from one file.
MAX_TOTAL_REPLICAS = 250_000


class Workload(Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN, max_length=63)]
    tenant: Annotated[str, Field(pattern=NAME_PATTERN, max_length=63)]
    kind: Kind = Field(description="online (serving), batch (jobs, training) or dev (notebooks).")
    memory_gib: float = Field(gt=0, le=4096, description="GPU memory one replica needs, in GiB.")
    compute: float = Field(
        gt=0, le=1, description="Share of one whole GPU's compute one replica needs (its expected utilization)."
    )
    replicas: int = Field(1, ge=1, le=100_000)
    trust: Literal["trusted", "untrusted"] = Field(
        "trusted",
        description="untrusted: hardware isolation only (a MIG instance or a whole GPU of its own). An "
        "environment tenant marked untrusted makes its workloads untrusted too.",
    )
    latency: Latency | None = Field(
        None,
        description="Latency sensitivity. high: a unit of its own (MIG instance or whole GPU); medium: MPS "
        "but no time-slicing; low: any sharing. Default: medium for online, low for batch and dev.",
    )

    @property
    def latency_class(self) -> Latency:
        return self.latency or DEFAULT_LATENCY[self.kind]


class Demand(Strict):
    name: str = ""
    description: str = ""
    objective: Literal["gpus", "cost"] = Field(
        "gpus", description="Minimise the number of GPUs, or their summed relative cost."
    )
    compute_budget: float = Field(
        1.0, gt=0, le=1,
        description="Most of a shared unit's compute that the replicas sharing it may add up to (1.0: all of it).",
    )
    max_shared_replicas: int = Field(
        8, ge=2, le=48,
        description="Most replicas on one time-sliced or MPS unit; with --env the guardrails may lower it.",
    )
    driver_branch: int = Field(
        DEFAULT_DRIVER_BRANCH, ge=450, le=999,
        description="NVIDIA driver branch the fleet runs (580 for R580): MIG profiles that need a newer one are not "
        "planned, and profile memory is the branch's. With --env the environment's defaults.driver_branch wins.",
    )
    context_reserve_gib: float = Field(
        DEFAULT_CONTEXT_RESERVE_GIB, ge=0, le=16,
        description="GPU memory one replica's CUDA context takes beside memory_gib; every replica is planned "
        "with memory_gib plus this. Unset: policies/guardrails.yaml planner.context_reserve_gib, else 0.5.",
    )
    gpus: list[GpuSupply] = Field(default_factory=list, description="GPU models available (or give --gpus).")
    workloads: list[Workload] = Field(default_factory=list)

    @model_validator(mode="after")
    def _some_work(self) -> Demand:
        if not self.workloads:
            raise invalid("the demand lists no workloads, so there is nothing to plan",
                          "add workloads: [{name, tenant, kind, memory_gib, compute, replicas}, ...] "
                          "(examples/demand/inference.yaml shows one: `gpushare init --example demand`)")
        return self

    @model_validator(mode="after")
    def _within_one_run(self) -> Demand:
        total = sum(w.replicas for w in self.workloads)
        if total > MAX_TOTAL_REPLICAS:
            raise invalid(f"the workloads ask for {total:,} replicas in all, above the {MAX_TOTAL_REPLICAS:,} one "
                          "run of `gpushare pack` plans", "split the demand (by cluster, region or tenant) into "
                          "files of fewer replicas and pack each")
        return self

    @model_validator(mode="after")
    def _unique(self) -> Demand:
        seen: set[str] = set()
        for w in self.workloads:
            if w.name in seen:
                raise invalid(f"workload {w.name!r} is listed twice", "give every workload its own name")
            seen.add(w.name)
        return self


def load_demand(path: Path) -> tuple[Demand, Located]:
    """Read and validate a demand file; every problem located by file, line and path."""
    doc = read_yaml(path)
    if not isinstance(doc.data, dict):
        raise GpushareError(Problem("a demand file must be a mapping", file=doc.file, line=1,
                                    fix="start from examples/demand/inference.yaml (`gpushare init --example demand` "
                                        "adds it)"))
    try:
        demand = Demand.model_validate(file_body(doc, "Demand"))
    except ValidationError as exc:
        problems = validation_problems(exc, doc, Demand)
        # A duplicate name is reported on the list; point at the second entry instead.
        for i, problem in enumerate(problems):
            match = re.match(r"workload '(.+)' is listed twice", problem.message)
            if match:
                index = [w.get("name") for w in doc.data.get("workloads", []) if isinstance(w, dict)]
                second = [j for j, n in enumerate(index) if n == match.group(1)][1:2]
                if second:
                    problems[i] = doc.problem(("workloads", second[0], "name"), problem.message, problem.fix)
        raise GpushareError(problems) from None
    return demand, doc


def parse_gpus_option(text: str) -> list[GpuSupply]:
    """`--gpus "NVIDIA H100 80GB HBM3=16,NVIDIA L4"`: model=count, or a model alone for as many as needed."""
    supplies: list[GpuSupply] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise GpushareError(Problem(f"--gpus: empty item in {text!r}", fix='write "MODEL=COUNT,MODEL=COUNT"'),
                                exit_code=2)
        model, sep, count = item.rpartition("=")
        if not sep:
            supplies.append(GpuSupply(model=item, count=None, cost=1.0))
            continue
        if not re.fullmatch(r"\d{1,6}", count.strip()) or int(count) > 100_000:
            raise GpushareError(Problem(f"--gpus: count {count[:20]!r} of {model.strip()[:60]!r} is not a whole "
                                        "number up to 100000", fix='write "MODEL=COUNT", e.g. "NVIDIA L4=8"'),
                                exit_code=2)
        if model.strip() in {s.model for s in supplies}:
            raise GpushareError(Problem(f"--gpus: {model.strip()[:60]!r} is listed twice",
                                        fix="give each model once with its total count"), exit_code=2)
        supplies.append(GpuSupply(model=model.strip(), count=int(count), cost=1.0))
    return supplies
