"""Constrained scalar types shared by the config models.

Each type validates one thing a Kubernetes or Slurm object depends on, so a
mistake is reported against the config key that holds it, before deployment.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

# RFC 1123 label, as Kubernetes requires for namespaces, Services and the
# names Slurm resolves through cluster DNS.
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

# Kubernetes resource.Quantity: a number with an optional binary/decimal suffix
# or exponent (k8s.io/apimachinery/pkg/api/resource).
_QUANTITY = re.compile(
    r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)

# OCI image reference: [registry[:port]/]path[:tag][@digest]
_IMAGE = re.compile(
    r"^(?P<name>[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]{1,2}[a-z0-9]+)*)*)"
    r"(:(?P<tag>[\w][\w.-]{0,127}))?"
    r"(@(?P<digest>sha256:[a-f0-9]{64}))?$"
)

# Label keys: optional DNS-subdomain prefix, then a name segment.
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")

# Slurm time limit: INFINITE/UNLIMITED or [days-]hours:minutes:seconds and the
# shorter forms documented for PartitionName MaxTime in slurm.conf(5).
_SLURM_TIME = re.compile(
    r"^(INFINITE|UNLIMITED|\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2})$"
)


def is_dns_label(value: str) -> bool:
    return len(value) <= 63 and bool(_DNS1123_LABEL.match(value))


# A relative path below a mount: plain segments, no '.' or '..' (a subPath must
# not contain '..', and a model path must not leave the read-only models mount).
_RELATIVE_PATH = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")


# Kubernetes minor version, as the schema files are named: '1.34'.
_KUBERNETES_MINOR = re.compile(r"^1\.\d{2}$")

# Slurm PartitionName: a word Slurm accepts and shells need not quote.
_PARTITION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


def _dns_label(value: str) -> str:
    if not is_dns_label(value):
        raise ValueError(
            "must be a DNS-1123 label: lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters"
        )
    return value


def _quantity(value: str) -> str:
    if not _QUANTITY.match(value):
        raise ValueError("must be a Kubernetes quantity such as '4Gi', '500m' or '2'")
    return value


def _image(value: str) -> str:
    if not _IMAGE.match(value):
        raise ValueError("must be an image reference such as 'registry/name:tag'")
    return value


def _label_key(value: str) -> str:
    if len(value) > 253 or not _LABEL_KEY.match(value):
        raise ValueError("must be a Kubernetes label key such as 'example.com/pool'")
    return value


def _label_value(value: str) -> str:
    if not _LABEL_VALUE.match(value):
        raise ValueError("must be a Kubernetes label value (63 characters of [A-Za-z0-9_.-])")
    return value


def _relative_path(value: str) -> str:
    if not _RELATIVE_PATH.match(value) or any(part in (".", "..") for part in value.split("/")):
        raise ValueError("must be a relative path such as 'org/model', without '.' or '..' segments")
    return value


def _kubernetes_minor(value: str) -> str:
    if not _KUBERNETES_MINOR.match(value):
        raise ValueError("must be a Kubernetes minor version such as '1.34' (no 'v', no patch)")
    return value


def _partition_name(value: str) -> str:
    if not _PARTITION_NAME.match(value):
        raise ValueError("must be a Slurm partition name: letters, digits, '_' and '-', at most 63 characters")
    return value


def _slurm_time(value: str) -> str:
    if not _SLURM_TIME.match(value):
        raise ValueError("must be a Slurm time such as '7-00:00:00', '48:00:00' or 'INFINITE'")
    return value


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
Quantity = Annotated[str, AfterValidator(_quantity)]
ImageRef = Annotated[str, AfterValidator(_image)]
LabelKey = Annotated[str, AfterValidator(_label_key)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
SlurmTime = Annotated[str, AfterValidator(_slurm_time)]
RelativePath = Annotated[str, AfterValidator(_relative_path)]
KubernetesMinor = Annotated[str, AfterValidator(_kubernetes_minor)]
PartitionName = Annotated[str, AfterValidator(_partition_name)]


def image_is_pinned(reference: str) -> bool:
    """True when the reference names an exact tag (not 'latest') or a digest."""
    match = _IMAGE.match(reference)
    if not match:
        return False
    tag = match.group("tag")
    return bool(match.group("digest")) or (tag is not None and tag != "latest")
