"""The strings of the v1 file formats: the pattern each kind of value must match, with the words its error uses
and the fix it gives, and the checks no regex can make (template markers, addresses that can only be the
controller). Every other module of the format builds on these."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, GetCoreSchemaHandler, GetJsonSchemaHandler, WithJsonSchema
from pydantic_core import PydanticCustomError, core_schema

from gpushare.core.loading import explain_pattern

NAME_PATTERN = explain_pattern(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    "use lowercase letters, digits and '-', starting and ending with a letter or digit (a DNS label)")
# Label values are at most 63 characters; config names are built from a profile name, a GPU slug and a hash.
PROFILE_NAME_PATTERN = explain_pattern(
    r"^[a-z0-9]([-a-z0-9]{0,28}[a-z0-9])?$", "use at most 30 lowercase letters, digits and '-' (a DNS label)")
# Digits are spelt [0-9]: `\d` also matches other scripts' digits (pydantic's and Python's regexes both), which
# int() would then read as numbers while every tool downstream sees a different string (one reading of each value).
VERSION_PATTERN = explain_pattern(
    r"^[0-9]+\.[0-9]+(\.[0-9]+)?$",
    "write a version as MAJOR.MINOR or MAJOR.MINOR.PATCH in quotes, in the digits 0-9, e.g. \"1.18.2\"")
RESOURCE_PATTERN = explain_pattern(
    r"^[a-z0-9.-]+/[a-zA-Z0-9._-]+$",
    "write an extended resource name, e.g. nvidia.com/gpu or nvidia.com/mig-1g.10gb")

KUBERNETES_MINOR_PATTERN = explain_pattern(
    r"^1\.[0-9]{2}$",
    "write the cluster's Kubernetes minor as \"1.NN\" in quotes, in the digits 0-9, e.g. \"1.33\"")
DRA_DRIVER_VERSION_PATTERN = explain_pattern(
    r"^v[0-9]+\.[0-9]+\.[0-9]+$", "write a driver release as vMAJOR.MINOR.PATCH in the digits 0-9, e.g. v0.5.0")
FEATURE_GATE_PATTERN = r"^[A-Z][A-Za-z0-9]{0,62}$"


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"[0-9]+", text))


# ---------------------------------------------------------------- strings that reach Ansible, Jinja2 and shells
# Environment files are data, never templates or shell (docs/safety-rules.md rule 12): every string matches the
# narrowest pattern its domain allows, so none can carry `{{ }}`, `{% %}`, `$( )` or backticks into Ansible, Jinja2
# or a command line.

_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
LABEL_KEY_PATTERN = rf"^({_DNS_LABEL}(\.{_DNS_LABEL})*/)?{_LABEL_NAME}$"
LABEL_VALUE_PATTERN = rf"^({_LABEL_NAME})?$"
# kubectl's context names: GKE writes gke_<project>_<location>_<cluster>, EKS an ARN (arn:aws:eks:...:cluster/x).
KUBECONFIG_CONTEXT_PATTERN = r"^[A-Za-z0-9._@:/-]+$"
CLOUD_LOCATION_PATTERN = rf"^{_DNS_LABEL}$"
MACHINE_TYPE_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
GPU_MODEL_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9 _.+()]*[A-Za-z0-9)])?$"
LAYOUT_TEXT_PATTERN = r"^[A-Za-z0-9.+=,@ ]*$"
# What starts template code in Jinja2 (and so in Ansible) or a command substitution in a shell.
TEMPLATE_OR_SHELL_MARKERS = ("{{", "{%", "{#", "$(", "`")
DESCRIPTION_MAX_LENGTH = 2000
HOSTNAME_MAX_LENGTH = 253


def _refused(value: str, message: str, fix: str, **context: str) -> PydanticCustomError:
    """A refusal that quotes the value (shortened) without reading its braces as a message template."""
    shown = value if len(value) <= 80 else value[:77] + "..."
    return PydanticCustomError("gpushare", "{value} " + message, {"value": repr(shown), "fix": fix, **context})


@dataclass(frozen=True)
class TextRule:
    """A pattern a string field must match, with the error's wording; the JSON schema carries the pattern too."""

    pattern: str
    what: str
    fix: str
    max_length: int = 63

    def check(self, value: str) -> str:
        if len(value) > self.max_length or re.fullmatch(self.pattern, value) is None:
            raise _refused(value, f"is not {self.what} (at most {self.max_length} characters)", self.fix)
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {**handler(schema), "pattern": self.pattern, "maxLength": self.max_length}


LabelKey = Annotated[str, TextRule(
    LABEL_KEY_PATTERN, "a Kubernetes label key", "write [prefix/]name: an optional lowercase DNS prefix, then letters, "
    "digits, '-', '_' or '.' starting and ending alphanumeric", max_length=HOSTNAME_MAX_LENGTH + 64)]
LabelValue = Annotated[str, TextRule(
    LABEL_VALUE_PATTERN, "a Kubernetes label value", "use letters, digits, '-', '_' and '.', starting and ending with "
    "a letter or digit (or leave it empty)")]
KubeconfigContext = Annotated[str, TextRule(
    KUBECONFIG_CONTEXT_PATTERN, "a kubeconfig context name", "use the name `kubectl config get-contexts` shows: "
    "letters, digits and . _ @ : / - (no spaces, quotes, braces, '$' or backticks)", max_length=HOSTNAME_MAX_LENGTH)]
CloudLocation = Annotated[str, TextRule(
    CLOUD_LOCATION_PATTERN, "a cloud region or zone", "use the cloud's own name, e.g. europe-west4, europe-west4-a "
    "or eu-west-1a")]
MachineType = Annotated[str, TextRule(
    MACHINE_TYPE_PATTERN, "a cloud machine type", "use the cloud's own name, e.g. g2-standard-24 or p5.48xlarge")]
GpuModelName = Annotated[str, TextRule(
    GPU_MODEL_PATTERN, "a GPU model name", "use the NVML product name, an alias or the PCI id that "
    "`gpushare gpus` lists, e.g. NVIDIA A100-SXM4-80GB", max_length=96)]
LayoutText = Annotated[str, TextRule(
    LAYOUT_TEXT_PATTERN, "a MIG layout", "write MIG profiles with counts, e.g. '1g.10gb=2,2g.20gb=1,3g.40gb=1'",
    max_length=512)]
ProfileName = Annotated[str, TextRule(
    PROFILE_NAME_PATTERN, "a sharing profile name", "name a profile from profiles/ or this file's profiles: "
    "lowercase letters, digits and '-'", max_length=30)]
DnsName = Annotated[str, TextRule(
    NAME_PATTERN, "a DNS label", "use lowercase letters, digits and '-', starting and ending with a letter or digit")]
ClusterName = Annotated[str, TextRule(
    NAME_PATTERN, "a cluster name", "name one of the environment's clusters: lowercase letters, digits and '-'")]
ResourceName = Annotated[str, TextRule(
    RESOURCE_PATTERN, "an advertised GPU resource name", "write <domain>/<name>, e.g. nvidia.com/mig-1g.10gb",
    max_length=HOSTNAME_MAX_LENGTH + 64)]


# A user or group as Kubernetes' authenticators name it (an OIDC claim with its prefix, a certificate's CN or O, a
# directory group's name or id, an email address): printable, no quotes, braces, '$' or backticks.
SUBJECT_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9._@:/+=, ]*[A-Za-z0-9])?$"
USER_PREFIX = "user:"
# Kubernetes' own identities and the groups it puts identities in (every signed-in user, every ServiceAccount, every
# kubelet, system:masters): none is a tenant's people.
SYSTEM_SUBJECT_PREFIX = "system:"


def _subject(value: str) -> str:
    name = value.removeprefix(USER_PREFIX)
    if not name:
        raise _refused(value, "names no user", f"write {USER_PREFIX}<name>, e.g. {USER_PREFIX}alice@example.com")
    if name.startswith(SYSTEM_SUBJECT_PREFIX):
        raise _refused(value, "is one of Kubernetes' own identities or groups (system:...), which hold every "
                       "signed-in user, ServiceAccount or node, or the cluster's own components",
                       "name the group (or user:<name>) your identity provider gives the tenant's people; a CI "
                       "ServiceAccount gets a RoleBinding of the tenant's own to gpushare-tenant-developer")
    return value


Subject = Annotated[str, TextRule(
    SUBJECT_PATTERN, "a Kubernetes group or user name", "write the group as your authenticator names it (e.g. "
    "oidc:ml-team), or user:<name> for one user: letters, digits, spaces and . _ @ : / + = , - (no quotes, braces, "
    "'$' or backticks)", max_length=HOSTNAME_MAX_LENGTH), AfterValidator(_subject)]


def _description(value: str) -> str:
    for marker in TEMPLATE_OR_SHELL_MARKERS:
        if marker in value:
            raise _refused(value, "holds {marker}, which starts template code in Jinja2 or a command in a shell",
                           "reword it without '{{', '{%', '{#', '$(' or backticks: gpushare passes environment "
                           "strings to Ansible and Jinja2 as data, and refuses anything that could run as code there",
                           marker=repr(marker))
    if len(value) > DESCRIPTION_MAX_LENGTH:
        raise _refused(value, f"is longer than {DESCRIPTION_MAX_LENGTH} characters", "shorten it")
    if not all(ch.isprintable() or ch in "\n\t" for ch in value):
        raise _refused(value, "holds control characters", "keep to printable text, newlines and tabs")
    return value


Description = Annotated[str, AfterValidator(_description), WithJsonSchema(
    {"type": "string", "maxLength": DESCRIPTION_MAX_LENGTH, "not": {"pattern": r"\{\{|\{%|\{#|\$\(|`"}})]


# A management address names another machine: these can only be the machine gpushare runs on (or no machine), so
# the same file would mean the CI runner in `check` and the deploy host in `rollout`.
_CONTROLLER_ONLY_NAMES = ("localhost", "localhost.localdomain")
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # RFC 1122 "this host on this network"; Linux reads it as local


def _ip_of(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(value.partition("%")[0])
    except ValueError:
        return None


def address_key(value: str) -> str:
    """One spelling per machine, to find two hosts at one address: an IPv4-mapped IPv6 address (::ffff:10.0.0.1)
    is its IPv4 address, IPv6 is compressed and lowercase, a hostname is itself."""
    ip = _ip_of(value)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return value if ip is None else ip.compressed


def _controller_only(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an address cannot be another machine's management address, or None."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "is a loopback address: it would be the machine gpushare runs on, not a GPU host"
    if ip.is_unspecified or (isinstance(ip, ipaddress.IPv4Address) and ip in _THIS_NETWORK):
        return "is an unspecified (\"this host\") address, which names no other machine"
    if ip.is_link_local:
        return ("is a link-local address: which machine it reaches depends on the controller's own links (169.254."
                "169.254 is a cloud's metadata server)")
    if ip.is_multicast or (isinstance(ip, ipaddress.IPv4Address) and ip.is_reserved):
        return "is a multicast, broadcast or reserved address, not one machine's"
    if isinstance(ip, ipaddress.IPv6Address) and int(ip) >> 32 == 0:
        return "is an IPv4-compatible IPv6 address (::a.b.c.d, deprecated by RFC 4291), which no host answers at"
    return None


def _address(value: str) -> str:
    """An IP address (v4, or v6 with at most an interface scope) or an RFC 1123 hostname in lowercase; never one
    that can only be the controller itself."""
    fix = "write an IPv4 or IPv6 address (e.g. 10.40.1.11) or a lowercase DNS hostname (e.g. gpu-01.example.net)"
    address, _, scope = value.partition("%")
    ip = _ip_of(value)
    if ip is not None:
        if scope and not (":" in address and re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", scope)):
            raise _refused(value, "has a scope that is not an interface name", fix)
        why = _controller_only(ip)
        if why is not None:
            raise _refused(value, why, "write the host's own routable management address or DNS hostname (e.g. "
                           "10.40.1.11 or gpu-01.example.net)")
        return value
    labels = value.split(".")
    # isascii: str.isdigit() is also true of other scripts' digits (and of superscripts), which are no address.
    if all(label.isascii() and label.isdigit() for label in labels):
        raise _refused(value, "is not an IP address (four parts of 0-255, no leading zeros)", fix)
    if len(value) > HOSTNAME_MAX_LENGTH or not all(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", label)
                                                   for label in labels):
        raise _refused(value, "is neither an IP address nor an RFC 1123 hostname (labels of 1-63 lowercase "
                       "letters, digits and '-', not starting or ending with '-'; 253 characters at most)", fix)
    if labels[-1].isdigit():
        raise _refused(value, "ends in a number, so it reads as a broken IP address rather than a hostname", fix)
    if value in _CONTROLLER_ONLY_NAMES or value.endswith(".localhost"):
        raise _refused(value, "names the machine gpushare runs on (RFC 6761 localhost), not a GPU host",
                       "write the host's own DNS hostname or routable management address")
    return value


Address = Annotated[str, AfterValidator(_address), WithJsonSchema(
    {"type": "string", "anyOf": [{"format": "ipv4"}, {"format": "ipv6"}, {"format": "hostname"}],
     "pattern": r"^[A-Za-z0-9.:%_-]+$", "maxLength": HOSTNAME_MAX_LENGTH})]
