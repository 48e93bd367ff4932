"""The GPU catalog: every GPU model gpushare knows, with its exact MIG geometry.

Geometry comes only from `data/mig_profiles.yaml` (NVIDIA's profiles, copied verbatim); gpushare's own
additions (non-MIG models, aliases, GKE names, driver minimums) come from `data/catalog_extra.yaml`. Nothing
else in the project states GPU geometry. Only stdlib and yaml here: `gpushare mig validate` must start fast.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import yaml

from gpushare.core.errors import GpushareError, Problem

# Only these engines are a shared, countable resource between instances; copy engines scale with the slices.
MEDIA_ENGINES = ("nvdec", "nvenc", "jpeg", "ofa")

NVIDIA_PCI_VENDOR = "10DE"


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of one GPU model; the same name can mean other geometry on another model."""

    name: str
    id: int
    compute_slices: int
    memory_slices: int
    memory_gib: float | None
    max_count: int
    placements: tuple[int, ...]
    engines: tuple[tuple[str, int], ...]
    min_driver_branch: int | None
    nvml_profile_index: int | None = None
    memory_gib_other_drivers: tuple[float, ...] = ()  # what other drivers report, driver unnamed
    memory_gib_by_driver: tuple[tuple[int, float], ...] = ()  # (driver branch, GiB) where a capture names it

    @property
    def memory_gib_values(self) -> tuple[float, ...]:
        """Every memory size a driver is known to report for this profile: the main value first."""
        main = () if self.memory_gib is None else (self.memory_gib,)
        return main + tuple(v for v in self.memory_gib_other_drivers if v not in main)

    def memory_gib_on(self, driver_branch: int | None) -> float | None:
        """The memory this profile has on a driver branch: the branch's own value where one was read, else the
        catalog's main value."""
        if driver_branch is None:
            return self.memory_gib
        return dict(self.memory_gib_by_driver).get(driver_branch, self.memory_gib)

    @property
    def resource_suffix(self) -> str:
        """The device plugin's spelling in `nvidia.com/mig-<suffix>`: it turns `+` into `.`."""
        return self.name.replace("+", ".")


@dataclass(frozen=True, slots=True)
class CombinationRule:
    """Profiles that the driver only accepts together from a driver branch on."""

    profiles: frozenset[str]
    min_driver_branch: int
    source: str


@dataclass(frozen=True)
class GpuModel:
    name: str
    slug: str
    aliases: tuple[str, ...]
    pci_device_ids: tuple[str, ...]
    memory_gib: float
    mig_capable: bool
    compute_slices_total: int
    placement_units_total: int
    profiles: Mapping[str, MigProfile]
    confidence: str
    placement_confidence: str
    engine_totals: Mapping[str, int]
    engine_totals_inferred: bool
    combination_rules: tuple[CombinationRule, ...]
    gke_accelerator: str | None

    # The mapping fields are unhashable; the NVML name is the model's identity anyway.
    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def placements_exact(self) -> bool:
        return self.placement_confidence == "exact"

    def profile_memory_gib(self, profile: str, driver_branch: int | None) -> float | None:
        """A profile's memory on a driver branch (None: unknown driver), falling back to the catalog's main value."""
        return self.profile(profile).memory_gib_on(driver_branch)

    def profile(self, name: str) -> MigProfile:
        found = self.profiles.get(name)
        if found is None:
            raise GpushareError(
                Problem(unknown_profile_message(self, name), fix="use one of the profiles listed")
            )
        return found


def unknown_profile_message(model: GpuModel, name: str) -> str:
    if not model.mig_capable:
        return f"{model.name} does not support MIG, so it has no profile {name}"
    known = ", ".join(model.profiles)
    message = f"{name} is not a MIG profile of {model.name} (its profiles: {known})"
    # Resource names spell `+` as `.`; point back from that spelling to the profile.
    for profile in model.profiles.values():
        if profile.resource_suffix == name and profile.name != name:
            message += f"; did you mean {profile.name}?"
            break
    return message


class Catalog:
    """All known GPU models, keyed by NVML product name, with lookup by any of their names."""

    def __init__(self, models: Iterable[GpuModel]) -> None:
        self.models: Mapping[str, GpuModel] = MappingProxyType({m.name: m for m in models})
        self._by_name: dict[str, GpuModel] = {}
        self._by_pci: dict[str, GpuModel] = {}
        self._spellings: dict[str, str] = {}
        for model in self.models.values():
            spellings = [model.name, model.slug, *model.aliases]
            if model.gke_accelerator:
                spellings.append(model.gke_accelerator)
            for spelling in spellings:
                self._index(_name_key(spelling), model, spelling)
            for pci in model.pci_device_ids:
                device = pci[2:6]
                other = self._by_pci.setdefault(device, model)
                if other is not model:
                    raise ValueError(f"PCI id {pci} is listed for both {other.name} and {model.name}")

    def _index(self, key: str, model: GpuModel, spelling: str) -> None:
        other = self._by_name.setdefault(key, model)
        if other is not model:
            raise ValueError(f"GPU name {spelling!r} would mean both {other.name} and {model.name}")
        self._spellings.setdefault(spelling, model.name)

    def lookup(self, query: str) -> GpuModel:
        """By NVML name, alias, slug, GKE accelerator or PCI id (0x233010DE, 0x2330, 2330, 10de:2330)."""
        key = _name_key(query)
        found = self._by_name.get(key) if key else None
        if found is None:
            device = _pci_device(query)
            if device is not None:
                found = self._by_pci.get(device)
        if found is None:
            raise GpushareError(self._unknown(query), exit_code=2)
        return found

    def find(self, query: str) -> GpuModel | None:
        try:
            return self.lookup(query)
        except GpushareError:
            return None

    def _unknown(self, query: str) -> Problem:
        import difflib  # only on the error path

        names: list[str] = []
        key = _name_key(query)
        # A partial name ("H100") is better answered by the models that contain it than by edit distance.
        if len(key) >= 2:
            for spelling, name in self._spellings.items():
                if key in _name_key(spelling) and name not in names:
                    names.append(name)
        folded = {s.casefold(): s for s in self._spellings}
        for match in difflib.get_close_matches(query.strip().casefold(), list(folded), n=6, cutoff=0.5):
            name = self._spellings[folded[match]]
            if name not in names:
                names.append(name)
        if names:
            hint = "closest known: " + ", ".join(names[:5])
        else:
            hint = "known GPUs: " + ", ".join(self.models)
        return Problem(
            f"unknown GPU {query!r}; {hint}",
            fix="give an NVML product name, an alias, a slug, a GKE accelerator name or a PCI device id; "
                "`gpushare gpus` lists every model with its names",
        )


def _name_key(text: str) -> str:
    """Spelling-insensitive key: case, separators and a leading "NVIDIA" do not matter."""
    folded = text.strip().casefold()
    folded = re.sub(r"^nvidia(?=[\s_-])", "", folded)
    return re.sub(r"[^0-9a-z]+", "", folded)


_PCI_FORMS = (
    re.compile(r"^0x([0-9a-f]{4})(?:10de)?$"),
    re.compile(r"^([0-9a-f]{4})$"),
    re.compile(r"^10de:([0-9a-f]{4})$"),
)


def _pci_device(text: str) -> str | None:
    folded = text.strip().casefold()
    for form in _PCI_FORMS:
        match = form.match(folded)
        if match:
            return match.group(1).upper()
    return None


def normalise_pci_id(text: str | int) -> str:
    """`0x233010DE` from any accepted form (an NVML integer included)."""
    if isinstance(text, int):
        text = f"0x{text:08X}"
    device = _pci_device(text)
    if device is None:
        raise GpushareError(
            f"not a PCI device id: {text!r} (expected forms 0x233010DE, 0x2330, 10de:2330)", 2
        )
    return f"0x{device}{NVIDIA_PCI_VENDOR}"


def slug_of(name: str) -> str:
    """DNS-label-safe short form of an NVML name: "NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3"."""
    folded = re.sub(r"^nvidia\s+", "", name.strip().casefold())
    return re.sub(r"[^0-9a-z]+", "-", folded).strip("-")[:63]


def _profile_index(text: Any) -> int | None:
    # The file spells it "NVML_GPU_INSTANCE_PROFILE_1_SLICE (0)"; the number in parentheses is the constant.
    match = re.search(r"\((\d+)\)", str(text)) if text is not None else None
    return int(match.group(1)) if match else None


def _media_engine_totals(
    profiles: Mapping[str, MigProfile], compute_total: int, units_total: int
) -> dict[str, int]:
    # The file states no GPU totals; a full-GPU profile owns every engine, so its counts are the totals.
    totals: dict[str, int] = {}
    for profile in profiles.values():
        if profile.compute_slices != compute_total or profile.memory_slices != units_total:
            continue
        for engine, count in profile.engines:
            if engine in MEDIA_ENGINES:
                totals[engine] = max(totals.get(engine, 0), count)
    return totals


def _mig_model(name: str, raw: Mapping[str, Any], extra: Mapping[str, Any]) -> GpuModel:
    minimums = {m["profile"]: int(m["min_driver_branch"]) for m in extra.get("driver_minimums") or ()}
    profiles: dict[str, MigProfile] = {}
    for p in raw["profiles"]:
        profiles[p["name"]] = MigProfile(
            name=p["name"],
            id=int(p["id"]),
            compute_slices=int(p["compute_slices"]),
            memory_slices=int(p["memory_slices"]),
            memory_gib=None if p.get("memory_gib") is None else float(p["memory_gib"]),
            max_count=int(p["max_count"]),
            placements=tuple(int(s) for s in p["placements"]),
            engines=tuple((str(k), int(v)) for k, v in (p.get("engines") or {}).items()),
            min_driver_branch=minimums.pop(p["name"], None),
            nvml_profile_index=_profile_index(p.get("nvml_profile_index")),
            memory_gib_other_drivers=tuple(float(v) for v in p.get("memory_gib_other_drivers") or ()),
        )
    profiles = _with_driver_memory(name, profiles, extra.get("memory_by_driver") or ())
    if minimums:
        raise ValueError(f"catalog_extra.yaml: driver minimums for profiles {sorted(minimums)} not on {name}")
    rules = []
    for rule in extra.get("combination_rules") or ():
        missing = set(rule["profiles"]) - set(profiles)
        if missing:
            raise ValueError(f"catalog_extra.yaml: combination rule names {sorted(missing)}, not on {name}")
        rules.append(
            CombinationRule(frozenset(rule["profiles"]), int(rule["min_driver_branch"]), rule["source"])
        )
    compute_total = int(raw["compute_slices_total"])
    units_total = int(raw["placement_units_total"])
    engine_totals = _media_engine_totals(profiles, compute_total, units_total)
    pci_ids = [raw["pci_device_id"], *(extra.get("extra_pci_device_ids") or ())]
    return GpuModel(
        name=name,
        slug=extra.get("slug") or slug_of(name),
        aliases=tuple(extra.get("aliases") or ()),
        pci_device_ids=tuple(normalise_pci_id(p) for p in pci_ids),
        memory_gib=float(raw["total_memory_gib_nominal"]),
        mig_capable=True,
        compute_slices_total=compute_total,
        placement_units_total=units_total,
        profiles=MappingProxyType(profiles),
        confidence=str(raw["confidence"]),
        placement_confidence=str(raw["placement_confidence"]),
        engine_totals=MappingProxyType(engine_totals),
        engine_totals_inferred=bool(engine_totals),
        combination_rules=tuple(rules),
        gke_accelerator=extra.get("gke_accelerator"),
    )


def _with_driver_memory(name: str, profiles: dict[str, MigProfile], entries: Iterable[Mapping[str, Any]]
                        ) -> dict[str, MigProfile]:
    """Attach catalog_extra.yaml's per-branch memory; each value must be one mig_profiles.yaml already lists, so
    the numbers keep one source and catalog_extra only says which driver reported them."""
    by_profile: dict[str, dict[int, float]] = {}
    for entry in entries:
        branch = int(entry["driver_branch"])
        for profile, gib in (entry.get("memory_gib") or {}).items():
            known = profiles.get(profile)
            if known is None:
                raise ValueError(f"catalog_extra.yaml: memory_by_driver names {profile!r}, not a profile of {name}")
            if float(gib) not in known.memory_gib_values:
                raise ValueError(f"catalog_extra.yaml: {name} {profile} R{branch} memory {gib} GiB is neither "
                                 f"memory_gib nor memory_gib_other_drivers in mig_profiles.yaml")
            by_profile.setdefault(profile, {})[branch] = float(gib)
    return {n: replace(p, memory_gib_by_driver=tuple(sorted(by_profile.get(n, {}).items())))
            for n, p in profiles.items()}


def _plain_model(name: str, raw: Mapping[str, Any]) -> GpuModel:
    return GpuModel(
        name=name,
        slug=raw.get("slug") or slug_of(name),
        aliases=tuple(raw.get("aliases") or ()),
        pci_device_ids=tuple(normalise_pci_id(p) for p in raw["pci_device_ids"]),
        memory_gib=float(raw["memory_gib"]),
        mig_capable=False,
        compute_slices_total=0,
        placement_units_total=0,
        profiles=MappingProxyType({}),
        confidence="exact",
        placement_confidence="exact",
        engine_totals=MappingProxyType({}),
        engine_totals_inferred=False,
        combination_rules=(),
        gke_accelerator=raw.get("gke_accelerator"),
    )


def _read_yaml(filename: str) -> Any:
    # A plain path beside the package's data, not importlib.resources: that import alone costs the CLI's cold
    # start 20 ms. The package is gpushare/, one level above this module.
    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", filename), encoding="utf-8") as stream:
        text = stream.read()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml cuts the cold start of `mig validate`
    return yaml.load(text, Loader=loader)


def build_catalog(mig_profiles: Mapping[str, Any], extra: Mapping[str, Any]) -> Catalog:
    """The catalog from the two data documents (parsed YAML); `load_catalog` reads the packaged ones."""
    mig_extra: Mapping[str, Any] = extra.get("mig_models") or {}
    unknown = set(mig_extra) - set(mig_profiles)
    if unknown:
        raise ValueError(
            f"catalog_extra.yaml names MIG models that mig_profiles.yaml lacks: {sorted(unknown)}"
        )
    models = [_mig_model(name, raw, mig_extra.get(name) or {}) for name, raw in mig_profiles.items()]
    models += [_plain_model(name, raw) for name, raw in (extra.get("non_mig_models") or {}).items()]
    return Catalog(models)


@functools.cache
def load_catalog() -> Catalog:
    return build_catalog(_read_yaml("mig_profiles.yaml"), _read_yaml("catalog_extra.yaml"))
