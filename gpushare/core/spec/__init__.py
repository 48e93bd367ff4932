"""The environment and profile file formats as pydantic models (unknown keys are errors), by version under
gpushare.core.spec.v1 as NVIDIA's mig-parted keeps api/spec/v1. Importers take the current version's names from
here: `from gpushare.core.spec import Environment`. Reading a file into a model, with errors that name the file,
the line, the field and the fix, is gpushare.core.loading's, which every workspace file shares."""

from __future__ import annotations

# What the rest of gpushare imports from gpushare.core.spec: the current version, v1.
from gpushare.core.spec.v1.environment import (
    SYSTEM_NAMESPACES,
    Adoption,
    CloudNodes,
    Cluster,
    Defaults,
    DraDriver,
    Environment,
    Host,
    Pool,
    Taint,
    Tenant,
    is_system_namespace,
    load_environment,
)
from gpushare.core.spec.v1.patterns import (
    DRA_DRIVER_VERSION_PATTERN,
    FEATURE_GATE_PATTERN,
    KUBERNETES_MINOR_PATTERN,
    NAME_PATTERN,
    PROFILE_NAME_PATTERN,
    RESOURCE_PATTERN,
    USER_PREFIX,
    VERSION_PATTERN,
    address_key,
    version_tuple,
)
from gpushare.core.spec.v1.profiles import (
    ISOLATION,
    PROFILE_ADAPTER,
    SHARED_KINDS,
    ExclusiveProfile,
    MigProfile,
    MigSpec,
    MigTimeSlicingProfile,
    MpsProfile,
    MpsSpec,
    SharingProfile,
    TimeSlicingProfile,
    TimeSlicingSpec,
    load_profile_file,
)

__all__ = ["DRA_DRIVER_VERSION_PATTERN", "FEATURE_GATE_PATTERN", "ISOLATION", "KUBERNETES_MINOR_PATTERN",
           "NAME_PATTERN", "PROFILE_ADAPTER", "PROFILE_NAME_PATTERN", "RESOURCE_PATTERN", "SHARED_KINDS",
           "SYSTEM_NAMESPACES", "USER_PREFIX", "VERSION_PATTERN", "Adoption", "CloudNodes", "Cluster", "Defaults",
           "DraDriver", "Environment", "ExclusiveProfile", "Host", "MigProfile", "MigSpec", "MigTimeSlicingProfile",
           "MpsProfile", "MpsSpec", "Pool", "SharingProfile", "Taint", "Tenant", "TimeSlicingProfile",
           "TimeSlicingSpec", "address_key", "is_system_namespace", "load_environment", "load_profile_file",
           "version_tuple"]
