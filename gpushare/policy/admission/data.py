"""Data an envFrom can hand to a container: untrusted tenants' ConfigMap and Secret keys named like the
toolkit's variables."""

from __future__ import annotations

from typing import Any

from gpushare.core.namespaces import VISIBLE_DEVICES_ENV
from gpushare.policy.admission.environment import _DRIVER_CAPABILITIES, _DRIVER_ENV_RULE, _driver_env_ok


def _data_keys_ok(name: str, literal: str, kept: bool) -> str:
    """Every key of the map variable `name` is harmless as an environment variable, or (`kept`) an UPDATE leaves it
    as it was. Map lookups, not list scans: a ConfigMap may hold many keys."""
    # string(): on a Secret the type checker sees this map's values as bytes (it never is a Secret's at run time).
    value = f"string(variables.{name}[k])" if literal != "false" else "''"
    old = "old" + name[0].upper() + name[1:]
    keep = (f"(k in variables.{old} && variables.{old}[k] == variables.{name}[k]) || ") if kept else ""
    return f"variables.{name}.all(k, {keep}{_driver_env_ok('k', literal, value, visible_devices_ok=False)})"


# (variable, kind, field): a ConfigMap's data is text, a Secret's bytes; each map is read for its own kind only, in
# variables, so no validation meets a field (or a value type) its kind does not have.
_DATA_MAPS = (("configMapData", "ConfigMap", "data"), ("binaryData", "ConfigMap", "binaryData"),
              ("secretData", "Secret", "data"), ("stringData", "Secret", "stringData"))


def _data_variables() -> list[dict[str, str]]:
    out = []
    for name, kind, key in _DATA_MAPS:
        old = "old" + name[0].upper() + name[1:]
        out.append({"name": name, "expression": f"object.kind == '{kind}' && has(object.{key}) ? "
                                                f"object.{key} : {{}}"})
        out.append({"name": old, "expression": f"request.operation == 'UPDATE' && oldObject.kind == '{kind}' && "
                                               f"has(oldObject.{key}) ? oldObject.{key} : {{}}"})
    return out


# ConfigMaps' and Secrets' keys become variables through envFrom, which the workload policies cannot read: judged
# where they are written. A ConfigMap's data is plain text, so its capabilities value can be checked; a Secret's and
# binaryData are not read (a Secret's data is base64).
DATA_POLICIES: dict[str, dict[str, Any]] = {
    "gpushare-untrusted-no-driver-env-data": {
        "validations": [{
            # stringData is write-only (merged into data before it is stored): no old value to keep.
            "expression": " && ".join([_data_keys_ok("configMapData", "true", kept=True),
                                       _data_keys_ok("binaryData", "false", kept=True),
                                       _data_keys_ok("secretData", "false", kept=True),
                                       _data_keys_ok("stringData", "false", kept=False)]),
            "message": f"ConfigMaps and Secrets of untrusted tenants may not hold keys named {VISIBLE_DEVICES_ENV} or "
                       f"like the other variables envFrom would hand to the NVIDIA container toolkit unseen "
                       f"({_DRIVER_ENV_RULE}): rename the key (e.g. APP_<name>); NVIDIA_REQUIRE_* and "
                       f"{_DRIVER_CAPABILITIES}=compute,utility may stay in a ConfigMap",
            "reason": "Forbidden",
        }],
    },
}
