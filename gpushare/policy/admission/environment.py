"""The NVIDIA container toolkit's and the MPS client's environment: which variables leave the driver surface as
it is (read by the workload policies in env, and by the data policy in ConfigMap and Secret keys)."""

from __future__ import annotations

from gpushare.core.namespaces import VISIBLE_DEVICES_ENV
from gpushare.policy.admission.cel import _strings

# The toolkit (1.18) reads NVIDIA_* from a container's environment: capabilities (driver libraries and binaries
# mounted), MIG config and monitor devices, IMEX channels, GDS, MOFED, NVSWITCH and GDRCOPY devices; CUDA_VERSION
# without NVIDIA_REQUIRE_CUDA marks a legacy image, which gets every capability. CUDA_MPS_* point a CUDA client at
# an MPS daemon. What stays allowed narrows the surface: requirements (non-empty: an empty NVIDIA_REQUIRE_CUDA would
# make a CUDA image legacy), not checking them (only the tenant's own container fails), and the default capabilities.
_DRIVER_ENV_FAMILIES = ("NVIDIA_", "CUDA_")
_DRIVER_CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
_BENIGN_CAPABILITIES = ("", "compute", "utility", "compute,utility", "utility,compute")


def _driver_env_ok(name: str, literal: str, value: str, visible_devices_ok: bool = True) -> str:
    """CEL: the variable `name` set to `value` (known where `literal` holds) leaves the driver surface as it is."""
    free = ["NVIDIA_DISABLE_REQUIRE", *([VISIBLE_DEVICES_ENV] if visible_devices_ok else [])]
    return (f"!({name}.startsWith('NVIDIA_') || {name}.startsWith('CUDA_MPS_') || {name} == 'CUDA_VERSION') || "
            f"{name} in {_strings(free)} || ({literal} && (({name}.startsWith('NVIDIA_REQUIRE_') && {value} != '') "
            f"|| ({name} == '{_DRIVER_CAPABILITIES}' && {value} in {_strings(_BENIGN_CAPABILITIES)})))")


_ENV_VALUE = "(has(e.value) ? e.value : '')"
_DRIVER_ENV_RULE = ("NVIDIA_* variables (driver capabilities beyond compute and utility, MIG config or monitor "
                    "devices, IMEX channels, GDS, MOFED, NVSWITCH or GDRCOPY devices), CUDA_VERSION and CUDA_MPS_* "
                    "(an MPS daemon's pipe or log directory) widen what the NVIDIA container toolkit and the CUDA "
                    "client reach beyond the allocated GPU")
_DRIVER_ENV_FIX = (f"remove them; NVIDIA_REQUIRE_* (non-empty), NVIDIA_DISABLE_REQUIRE and {_DRIVER_CAPABILITIES} "
                   "with compute and utility stay allowed")
