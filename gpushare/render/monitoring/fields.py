"""The DCGM fields dcgm-exporter exports: its defaults plus the fields gpushare's alerts and capacity read.

With `--kubernetes-virtual-gpus` (env KUBERNETES_VIRTUAL_GPUS) the exporter labels the series of a shared GPU with
`vgpu` and the pod holding each replica. Only GPU_UTIL and FB_USED are measured per pod there; every other field
repeats the device value on each pod's series, so gpushare never sums those over pods (see PER_POD_FIELDS)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Literal

from gpushare.core.resolve import ResolvedFleet
from gpushare.core.spec import SHARED_KINDS
from gpushare.render.monitoring.counters import read_counters

FieldType = Literal["gauge", "counter", "label"]

DEFAULTS_FILE = "dcgm-default-counters.csv"

# The only fields dcgm-exporter measures per pod on time-sliced or MPS GPUs.
PER_POD_FIELDS = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"})

# The dcgm-exporter env var behind --kubernetes-virtual-gpus.
VIRTUAL_GPUS_ENV = "KUBERNETES_VIRTUAL_GPUS"


@dataclass(frozen=True)
class DcgmField:
    name: str
    type: FieldType
    help: str
    section: str


# What the alerts and `gpushare capacity` need beyond the exporter's defaults (section, name, type, help).
EXTRA_FIELDS: tuple[DcgmField, ...] = (
    DcgmField("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter",
              "Double-bit volatile ECC errors since the last driver load.", "gpushare: health"),
    DcgmField("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter",
              "Double-bit persistent ECC errors over the GPU's life.", "gpushare: health"),
    DcgmField("DCGM_EXP_XID_ERRORS_COUNT", "counter",
              "XID errors reported during the exporter's last window (one series per xid).", "gpushare: health"),
    DcgmField("DCGM_FI_DEV_THERMAL_VIOLATION", "counter",
              "Time throttled by thermal limits (in ns).", "gpushare: health"),
    DcgmField("DCGM_FI_DEV_POWER_VIOLATION", "counter",
              "Time throttled by power limits (in ns).", "gpushare: health"),
)

# Fields gpushare's rules depend on; each must be among the rendered fields (a test keeps this true).
REQUIRED_FIELDS = frozenset({
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_POWER_VIOLATION",
})


def parse_counters(text: str, source: str = "counters CSV") -> list[DcgmField]:
    """Fields of a dcgm-exporter counters CSV, read as dcgm-exporter reads it (counters.read_counters); each in the
    section whose title comment comes last before it."""
    section_at = [""]  # section_at[n]: the section line n is in
    for raw in text.split("\n"):
        title = raw.lstrip("#").strip()
        # A section title is a comment that is not itself a commented-out field line.
        if raw.startswith("#") and title and "," not in title and \
                not title.startswith(("DCGM_", "If line", "Format", "NOTE")):
            section_at.append(title)
        else:
            section_at.append(section_at[-1])
    return [DcgmField(row.name, row.type, row.help, section_at[row.line])  # type: ignore[arg-type]
            for row in read_counters(text, source)]


@cache
def default_fields() -> tuple[DcgmField, ...]:
    text = files("gpushare.render.monitoring").joinpath(DEFAULTS_FILE).read_text()
    return tuple(parse_counters(text, f"gpushare/render/monitoring/{DEFAULTS_FILE}"))


def exported_fields() -> list[DcgmField]:
    """The exporter's defaults, then gpushare's additions (a default is never listed twice)."""
    fields = list(default_fields())
    names = {f.name for f in fields}
    fields += [f for f in EXTRA_FIELDS if f.name not in names]
    return fields


def needs_virtual_gpus(fleet: ResolvedFleet) -> bool:
    """Per-pod attribution matters where pods share a GPU or MIG instance through the device plugin."""
    return any(n.sharing in SHARED_KINDS and n.managed_by != "gke" for n in fleet.nodes)


def dcgm_exporter_env(fleet: ResolvedFleet) -> dict[str, str]:
    """Env vars for dcgm-exporter (`dcgmExporter.env`): per-pod series on shared GPUs."""
    return {VIRTUAL_GPUS_ENV: "true"} if needs_virtual_gpus(fleet) else {}
