"""Constrained scalar types shared by the config models.

Each type validates one thing a Kubernetes or Slurm object depends on, so a
mistake is reported against the config key that holds it, before deployment.
Every text that lands in a Slurm file or a manifest is single-line by
construction: no type here accepts whitespace where a line could break.
"""

from __future__ import annotations

import re
from typing import Annotated, Callable

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

# A relative path below a mount: plain segments, no '.' or '..' (a subPath must
# not contain '..', and a model path must not leave the read-only models mount).
_RELATIVE_PATH = re.compile(r"^(?!.*(^|/)\.\.?(/|$))[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")

# An absolute path on a file server, e.g. an NFS export.
_ABSOLUTE_PATH = re.compile(r"^(?!.*(^|/)\.\.?(/|$))/([A-Za-z0-9._-]+/?)*$")

# Kubernetes minor version, as the schema files are named: '1.34'.
_KUBERNETES_MINOR = re.compile(r"^1\.\d{2}$")

# Slurm PartitionName: a word Slurm accepts and shells need not quote.
_PARTITION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")

# A host name (dotted DNS labels, any case) or an IPv4/IPv6 address.
_HOST = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*|[0-9A-Fa-f:.]+)$")

# A MySQL user or database name that needs no quoting.
_SQL_NAME = re.compile(r"^[A-Za-z0-9_$]{1,64}$")

# A DNS subdomain: dot-separated DNS-1123 labels (StorageClass and CSI driver names).
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# A POSIX user or group name as useradd(8) accepts by default (NAME_REGEX, 32 characters).
_POSIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")

# Free text that must stay on one line (CSI handles and attributes).
_SINGLE_LINE = re.compile(r"^[^\s]+$")


def is_dns_label(value: str) -> bool:
    return len(value) <= 63 and bool(_DNS1123_LABEL.match(value))


def _matching(pattern: re.Pattern[str], message: str, max_length: int = 253) -> AfterValidator:
    """A validator that accepts values matching ``pattern`` (at most ``max_length`` long)."""

    def check(value: str) -> str:
        # fullmatch: `$` alone would also accept a trailing newline, which breaks a Slurm line.
        if len(value) > max_length or not pattern.fullmatch(value):
            raise ValueError(message)
        return value

    return AfterValidator(check)


DnsLabel = Annotated[
    str,
    _matching(
        _DNS1123_LABEL,
        "must be a DNS-1123 label: lower-case letters, digits and '-', "
        "starting and ending with a letter or digit, at most 63 characters",
        max_length=63,
    ),
]
Quantity = Annotated[str, _matching(_QUANTITY, "must be a Kubernetes quantity such as '4Gi', '500m' or '2'")]
ImageRef = Annotated[str, _matching(_IMAGE, "must be an image reference such as 'registry/name:tag'", max_length=512)]
LabelKey = Annotated[str, _matching(_LABEL_KEY, "must be a Kubernetes label key such as 'example.com/pool'")]
LabelValue = Annotated[str, _matching(_LABEL_VALUE, "must be a Kubernetes label value (63 characters of [A-Za-z0-9_.-])")]
SlurmTime = Annotated[str, _matching(_SLURM_TIME, "must be a Slurm time such as '7-00:00:00', '48:00:00' or 'INFINITE'")]
RelativePath = Annotated[
    str, _matching(_RELATIVE_PATH, "must be a relative path such as 'org/model', without '.' or '..' segments", 1024)
]
AbsolutePath = Annotated[
    str, _matching(_ABSOLUTE_PATH, "must be an absolute path such as '/export/shared', without '.' or '..' segments", 1024)
]
KubernetesMinor = Annotated[
    str, _matching(_KUBERNETES_MINOR, "must be a Kubernetes minor version such as '1.34' (no 'v', no patch)")
]
PartitionName = Annotated[
    str, _matching(_PARTITION_NAME, "must be a Slurm partition name: letters, digits, '_' and '-', at most 63 characters")
]
HostName = Annotated[str, _matching(_HOST, "must be a host name or an IP address")]
PosixName = Annotated[
    str, _matching(_POSIX_NAME, "must be a POSIX user name: lower-case letters, digits, '_' and '-', at most 32 characters")
]
SqlName = Annotated[str, _matching(_SQL_NAME, "must be a MySQL name: letters, digits, '_' and '$', at most 64 characters")]
DnsSubdomain = Annotated[str, _matching(_DNS_SUBDOMAIN, "must be a DNS subdomain such as 'fast-rwx' or 'nfs.example.com'")]
CsiDriverName = Annotated[
    str, _matching(_DNS_SUBDOMAIN, "must be a CSI driver name such as 'lustre.csi.hpe.com' (at most 63 characters)", 63)
]
SingleLine = Annotated[str, _matching(_SINGLE_LINE, "must be one word without spaces or line breaks", 1024)]


def image_is_pinned(reference: str) -> bool:
    """True when the reference names an exact tag (not 'latest') or a digest."""
    match = _IMAGE.match(reference)
    if not match:
        return False
    tag = match.group("tag")
    return bool(match.group("digest")) or (tag is not None and tag != "latest")
