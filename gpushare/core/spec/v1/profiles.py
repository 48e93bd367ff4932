"""Sharing profiles (profiles/<name>.yaml, or an environment file's `profiles`), v1: one model per sharing kind,
told apart by `kind`, and what each kind isolates."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, model_validator

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.loading import (
    FILE_KINDS,
    Located,
    Strict,
    explain_tags,
    file_body,
    invalid,
    read_yaml,
    validation_problems,
)
from gpushare.core.spec.v1.patterns import PROFILE_NAME_PATTERN, Description, GpuModelName, LayoutText


class TimeSlicingSpec(Strict):
    replicas: int = Field(ge=2, le=64, description="Pods that share one GPU (or one MIG instance); at least 2.")
    rename_by_default: bool = Field(
        True, description="Advertise shared replicas as <resource>.shared so quotas can tell them apart."
    )
    fail_requests_greater_than_one: bool = Field(
        True, description="Refuse pods asking for more than one replica (they would get no more compute)."
    )


class MpsSpec(Strict):
    replicas: int = Field(ge=2, le=48, description="MPS clients per GPU; each gets 1/replicas of memory and SMs.")
    rename_by_default: bool = True


GenericLayout = Literal["balanced", "all-smallest", "whole"]


class MigSpec(Strict):
    layout: GenericLayout | None = Field(
        None,
        description="A layout that resolves per GPU model: balanced (one 3g, one 2g, 1g to fill, as NVIDIA's "
        "all-balanced), all-smallest (the most 1g instances), whole (one full-GPU instance).",
    )
    layouts: dict[GpuModelName, LayoutText] | None = Field(
        None,
        description="Explicit layouts keyed by GPU model (NVML name, alias or PCI id), as "
        "'1g.10gb=2,2g.20gb=1,3g.40gb=1'. Multisets only: mig-parted cannot place at chosen starts.",
    )

    @model_validator(mode="after")
    def _one_form(self) -> MigSpec:
        if (self.layout is None) == (self.layouts is None):
            raise invalid("a MIG block needs exactly one of 'layout' and 'layouts'",
                          "use layout: balanced|all-smallest|whole, or layouts: {<GPU model>: '<profile>=<n>,...'}")
        if self.layouts is not None:
            for key, text in self.layouts.items():
                if "@" in text:
                    raise invalid(
                        f"layouts[{key!r}] fixes starts ({text!r}); layouts here are multisets because "
                        "mig-parted cannot place instances at chosen starts",
                        "write 'profile=count' (use `gpushare mig validate` to check placements)",
                    )
        return self


class _ProfileBase(Strict):
    name: Annotated[str, Field(pattern=PROFILE_NAME_PATTERN)]
    description: Description = ""


class ExclusiveProfile(_ProfileBase):
    kind: Literal["exclusive"]


class TimeSlicingProfile(_ProfileBase):
    kind: Literal["time-slicing"]
    time_slicing: TimeSlicingSpec


class MpsProfile(_ProfileBase):
    kind: Literal["mps"]
    mps: MpsSpec

    @model_validator(mode="before")
    @classmethod
    def _never_on_mig(cls, data: Any) -> Any:
        if isinstance(data, dict) and "mig" in data:
            raise invalid(
                "MPS is never used on MIG devices (the device plugin does not support it)",
                "use kind mig-time-slicing to share MIG instances, or drop the mig block",
            )
        return data


class MigProfile(_ProfileBase):
    kind: Literal["mig"]
    mig: MigSpec


class MigTimeSlicingProfile(_ProfileBase):
    kind: Literal["mig-time-slicing"]
    mig: MigSpec
    time_slicing: TimeSlicingSpec


SharingProfile = Annotated[
    ExclusiveProfile | TimeSlicingProfile | MpsProfile | MigProfile | MigTimeSlicingProfile,
    Field(discriminator="kind"),
]
PROFILE_ADAPTER: TypeAdapter[Any] = TypeAdapter(SharingProfile)

ISOLATION = {
    "exclusive": "hardware",
    "mig": "hardware",
    "mps": "memory-partitioned",
    "time-slicing": "none",
    "mig-time-slicing": "none",
}
# The kinds whose GPUs several pods share without hardware isolation between them: their nodes carry the shared-GPU
# taint, and untrusted tenants never get them.
SHARED_KINDS = tuple(kind for kind, isolation in ISOLATION.items() if isolation != "hardware")
explain_tags(ISOLATION)  # pydantic puts a profile's kind into an error's location

_PROFILE_MODELS: dict[str, type[BaseModel]] = {
    "exclusive": ExclusiveProfile,
    "time-slicing": TimeSlicingProfile,
    "mps": MpsProfile,
    "mig": MigProfile,
    "mig-time-slicing": MigTimeSlicingProfile,
}


def load_profile_file(path: Path) -> tuple[Any, Located]:
    doc = read_yaml(path, "profile file")
    if not isinstance(doc.data, dict):
        raise GpushareError(Problem("a profile file must be a mapping", file=doc.file, line=1,
                                    fix="start from a profile in profiles/, e.g. profiles/exclusive.yaml"))
    kind = doc.data.get("kind")
    if kind in FILE_KINDS:
        raise GpushareError(doc.problem(("kind",), f"kind is {kind!r}: a profile file's kind is its sharing mode",
                                        fix=f"write kind: one of {', '.join(ISOLATION)}"), exit_code=2)
    model = _PROFILE_MODELS.get(kind) if isinstance(kind, str) else None
    try:
        profile = PROFILE_ADAPTER.validate_python(file_body(doc, None))
    except ValidationError as exc:
        raise GpushareError(validation_problems(exc, doc, model)) from None
    stem = path.name.removesuffix(".yaml").removesuffix(".yml")
    if profile.name != stem:
        raise GpushareError(doc.problem(("name",), f"profile name {profile.name!r} differs from its file name",
                                        fix=f"rename the file to {profile.name}.yaml or set name: {stem}"))
    return profile, doc
