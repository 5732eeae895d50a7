"""Constrained scalar types shared by the config models.

Each type validates one thing a Kubernetes or Slurm object depends on, so a
mistake is reported against the config key that holds it, before deployment.
Every text that lands in a Slurm file or a manifest is single-line by
construction: no type here accepts whitespace where a line could break.

How the checks stay safe on any input:

* the length is checked first, so no pattern ever runs on a huge value;
* patterns are ASCII-only (``re.ASCII`` and explicit classes: ``\\d`` would take
  other scripts' digits) and anchored with ``fullmatch`` (``$`` also accepts a
  trailing newline, which a YAML block scalar adds);
* patterns are linear: no repeated group overlaps its neighbour. Text with a
  separator (paths, DNS names, label keys) is split on it and checked segment
  by segment in code instead of by one nested pattern.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from decimal import Decimal
from typing import Annotated, Any, Callable, Mapping

from pydantic import AfterValidator, GetCoreSchemaHandler
from pydantic_core import core_schema

from dualsched.config.quantities import parse_quantity


def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text, re.ASCII)


# RFC 1123 label, as Kubernetes requires for namespaces, Services and the
# names Slurm resolves through cluster DNS.
_DNS1123_LABEL = _pattern(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

# Kubernetes resource.Quantity: a number with an optional binary/decimal suffix
# or exponent (k8s.io/apimachinery/pkg/api/resource). A three-digit exponent
# keeps the value inside Decimal's range, see _quantity_in_range.
_QUANTITY = _pattern(
    r"[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]{1,3})?"
)
# "no quantity may represent a number greater than 2^63-1" (resource.Quantity's documentation).
_QUANTITY_MAX = Decimal(2**63 - 1)

# OCI image reference: [registry[:port]/]path[:tag][@digest]
_IMAGE = _pattern(
    r"(?P<name>[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]{1,2}[a-z0-9]+)*)*)"
    r"(:(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(@(?P<digest>sha256:[a-f0-9]{64}))?"
)

# The name part of a label key, and a label value (empty allowed).
_LABEL_NAME = _pattern(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = _pattern(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")

# Slurm time limit: INFINITE/UNLIMITED, minutes, minutes:seconds, hours:minutes:seconds,
# days-hours, days-hours:minutes, days-hours:minutes:seconds (slurm.conf(5), MaxTime).
# Six digits in the leading field keep every form below Slurm's uint32 minutes.
# A time of day on the 24-hour clock, "HH:MM" (UTC).
_TIME_OF_DAY = _pattern(r"([01][0-9]|2[0-3]):[0-5][0-9]")
_SLURM_TIME = _pattern(r"INFINITE|UNLIMITED|[0-9]{1,6}(:[0-9]{2}){0,2}|[0-9]{1,6}-[0-9]{1,2}(:[0-9]{2}){0,2}")

# One segment of a path: a subPath must not contain '..', and a model path must
# not leave the read-only models mount, so '.' and '..' are refused in code.
_PATH_SEGMENT = _pattern(r"[A-Za-z0-9._-]+")

# Kubernetes minor version, as the schema files are named: '1.34'.
_KUBERNETES_MINOR = _pattern(r"1\.[0-9]{2}")

# A Slurm release, as its version begins: '25.11' (year and month, no patch level).
_SLURM_RELEASE = _pattern(r"[0-9]{2}\.[0-9]{2}")

# Slurm PartitionName: a word Slurm accepts and shells need not quote.
_PARTITION_NAME = _pattern(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")

# One label of a host name (any case); IP addresses are checked by ipaddress.
_HOST_LABEL = _pattern(r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?")
_IP_CHARACTERS = _pattern(r"[0-9A-Fa-f:.]+")

# A MySQL user or database name that needs no quoting.
_SQL_NAME = _pattern(r"[A-Za-z0-9_$]{1,64}")

# A POSIX user or group name as useradd(8) accepts by default (NAME_REGEX, 32 characters).
_POSIX_NAME = _pattern(r"[a-z_][a-z0-9_-]{0,31}")

# Free text that must stay one printable ASCII word (CSI handles and attributes).

# A key of a Secret or ConfigMap (Kubernetes IsConfigMapKey).
_SECRET_KEY = _pattern(r"[-._A-Za-z0-9]+")

# A password slurmdbd reads from slurmdbd.conf (StoragePass=...): printable ASCII that Slurm's
# parser takes as it is, so no whitespace, '#' (a comment), '\\' (an escape) or '"' (a quoted value).
_STORAGE_PASS = _pattern(r'[!$-\[\]-~]+')

# A Slurm hostlist expression of Kubernetes node names: 'gpu-[001-064],cpu-1'.
_HOSTLIST = _pattern(r"[-a-z0-9.,\[\]]+")

# Namespaces Kubernetes creates and runs itself; "Avoid creating namespaces with the prefix
# kube-, since it is reserved for Kubernetes system namespaces" (Kubernetes docs, Namespaces).
RESERVED_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
# Label and taint key prefixes reserved for Kubernetes itself, subdomains included
# (node.kubernetes.io/not-ready, node-role.kubernetes.io/...): the NodeRestriction admission
# plugin's isKubernetesLabel. policy/rules.py keeps the same two rules for the pack.
RESERVED_KEY_DOMAINS = ("kubernetes.io", "k8s.io")


def is_dns_label(value: str) -> bool:
    return len(value) <= 63 and bool(_DNS1123_LABEL.fullmatch(value))


def is_dns_subdomain(value: str) -> bool:
    return len(value) <= 253 and all(map(is_dns_label, value.split(".")))


def _is_host(value: str) -> bool:
    if _IP_CHARACTERS.fullmatch(value):
        try:
            ipaddress.ip_address(value)
            return True
        except ValueError:
            pass  # digits and dots may still be a host name
    return all(_HOST_LABEL.fullmatch(label) for label in value.split("."))


def _is_label_key(value: str) -> bool:
    prefix, slash, name = value.rpartition("/")
    return (not slash or is_dns_subdomain(prefix)) and bool(_LABEL_NAME.fullmatch(name))


def _is_path(value: str, absolute: bool) -> bool:
    if absolute:
        if not value.startswith("/"):
            return False
        value = value[1:].removesuffix("/")  # '/' alone and one trailing '/' are fine
        if not value:
            return True
    return all(_PATH_SEGMENT.fullmatch(segment) and segment not in (".", "..") for segment in value.split("/"))


def _is_cidr(value: str) -> bool:
    """An IP network written as Kubernetes writes one (ipBlock.cidr): canonical, with a prefix length."""
    try:
        return str(ipaddress.ip_network(value)) == value  # strict: refuses bits set past the prefix
    except ValueError:
        return False


# The key types OpenSSH 9 accepts in authorized_keys (sshd -T pubkeyacceptedalgorithms names their algorithms).
SSH_KEY_TYPES = frozenset({
    "ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com",
})
_SSH_KEY_COMMENT = _pattern(r"[ -~]*")


def _ssh_strings(blob: bytes) -> list[bytes]:
    """A key's encoding split into its length-prefixed fields (RFC 4251 string and mpint); [] when
    the lengths do not add up to the whole blob."""
    fields = []
    while blob:
        length = int.from_bytes(blob[:4], "big")
        if len(blob) < 4 + length:
            return []
        fields.append(blob[4 : 4 + length])
        blob = blob[4 + length :]
    return fields


def _is_ssh_public_key(value: str) -> bool:
    """One public key as ssh-keygen writes it: type, base64 key, optional comment; no options such as
    ``command=``. The key's encoding is its type and its fields, each prefixed by its length (RFC 4253
    6.6), so a key whose type was edited, or one cut short when pasted, is refused here rather than
    ignored by sshd."""
    key_type, _, rest = value.partition(" ")
    blob_text, _, comment = rest.partition(" ")
    if key_type not in SSH_KEY_TYPES or not _SSH_KEY_COMMENT.fullmatch(comment):
        return False
    try:
        fields = _ssh_strings(base64.b64decode(blob_text, validate=True))
    except binascii.Error:
        return False
    return len(fields) >= 2 and fields[0] == key_type.encode()


def _quantity_in_range(value: str) -> bool:
    return bool(_QUANTITY.fullmatch(value)) and parse_quantity(value) <= _QUANTITY_MAX


def _positive_quantity(value: str) -> bool:
    return _quantity_in_range(value) and parse_quantity(value) > 0


def is_reserved_namespace(name: str) -> bool:
    return name in RESERVED_NAMESPACES or name.startswith("kube-")


def is_reserved_key(key: str) -> bool:
    """A label or taint key under kubernetes.io/ or k8s.io/ (or a subdomain of them)."""
    prefix = key.rpartition("/")[0]
    return any(prefix == domain or prefix.endswith("." + domain) for domain in RESERVED_KEY_DOMAINS)


def _valid(accepts: Callable[[str], bool], message: str, max_length: int = 253) -> AfterValidator:
    """A validator that accepts values at most ``max_length`` long for which ``accepts`` is true."""

    def check(value: str) -> str:
        if len(value) > max_length or not accepts(value):
            raise ValueError(message)
        return value

    return AfterValidator(check)


def _matching(pattern: re.Pattern[str], message: str, max_length: int = 253) -> AfterValidator:
    return _valid(pattern.fullmatch, message, max_length)


def _refusing(reserved: Callable[[str], bool], message: str) -> AfterValidator:
    def check(value: str) -> str:
        if reserved(value):
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
Namespace = Annotated[
    DnsLabel,
    _refusing(is_reserved_namespace, "is a Kubernetes system namespace (default, kube-system, kube-public, kube-*)"),
]
Quantity = Annotated[
    str, _valid(_quantity_in_range, "must be a Kubernetes quantity such as '4Gi', '500m' or '2', at most 2^63-1", 64)
]
StorageSize = Annotated[
    str,
    _valid(_positive_quantity, "must be a Kubernetes quantity above zero such as '10Gi' (the API server refuses an empty volume)", 64),
]
ImageRef = Annotated[str, _matching(_IMAGE, "must be an image reference such as 'registry/name:tag'", max_length=512)]
# 253 for the prefix, '/', 63 for the name.
LabelKey = Annotated[str, _valid(_is_label_key, "must be a Kubernetes label key such as 'example.com/pool'", 317)]
OwnLabelKey = Annotated[
    LabelKey,
    _refusing(is_reserved_key, "is under a prefix Kubernetes reserves for itself (kubernetes.io/, k8s.io/ and their subdomains)"),
]
LabelValue = Annotated[str, _matching(_LABEL_VALUE, "must be a Kubernetes label value (63 characters of [A-Za-z0-9_.-])", 63)]
SlurmTime = Annotated[
    str, _matching(_SLURM_TIME, "must be a Slurm time such as '7-00:00:00', '48:00:00' or 'INFINITE'", 16)
]
TimeOfDay = Annotated[str, _matching(_TIME_OF_DAY, "must be a time of day 'HH:MM' on the 24-hour clock (UTC)", 5)]
# 1024: a path Kubernetes and NFS accept without trouble (Linux PATH_MAX is 4096).
RelativePath = Annotated[
    str,
    _valid(lambda v: _is_path(v, absolute=False), "must be a relative path such as 'org/model', without '.' or '..' segments", 1024),
]
AbsolutePath = Annotated[
    str,
    _valid(lambda v: _is_path(v, absolute=True), "must be an absolute path such as '/export/shared', without '.' or '..' segments", 1024),
]
SlurmRelease = Annotated[str, _matching(_SLURM_RELEASE, "must be a Slurm release such as '25.11' (no patch level)", 5)]
KubernetesMinor = Annotated[
    str, _matching(_KUBERNETES_MINOR, "must be a Kubernetes minor version such as '1.34' (no 'v', no patch)", 4)
]
PartitionName = Annotated[
    str, _matching(_PARTITION_NAME, "must be a Slurm partition name: letters, digits, '_' and '-', at most 63 characters", 63)
]
HostName = Annotated[str, _valid(_is_host, "must be a host name or an IP address")]
# 43: an IPv6 address (39 characters) and '/128'.
Cidr = Annotated[str, _valid(_is_cidr, "must be an IP network such as '10.0.0.0/16' or 'fd00::/64', nothing set past the prefix", 43)]
PosixName = Annotated[
    str, _matching(_POSIX_NAME, "must be a POSIX user name: lower-case letters, digits, '_' and '-', at most 32 characters", 32)
]
# 16384: an RSA key of 16384 bits (ssh-keygen's largest) is about 2.8k characters, with room for a comment.
SshPublicKey = Annotated[
    str,
    _valid(_is_ssh_public_key, "must be one OpenSSH public key line such as 'ssh-ed25519 AAAAC3Nza... user@host' "
           "(the contents of a .pub file, without options)", 16384),
]
SqlName = Annotated[str, _matching(_SQL_NAME, "must be a MySQL name: letters, digits, '_' and '$', at most 64 characters", 64)]
DnsSubdomain = Annotated[str, _valid(is_dns_subdomain, "must be a DNS subdomain such as 'fast-rwx' or 'nfs.example.com'")]
ExtendedResourceName = Annotated[
    str,
    _valid(lambda v: "/" in v and _is_label_key(v) and not is_reserved_key(v),
           "must be a device plugin's resource name such as 'rdma/rdma_shared_device_a': a domain outside "
           "kubernetes.io, '/', a name", 317),  # fmt: skip
]
NcclVariable = Annotated[str, _matching(_pattern(r"NCCL_[A-Z0-9_]{1,64}"), "must be an NCCL variable such as 'NCCL_IB_HCA'", 69)]
# One line of /etc/nccl.conf ("NAME=value"): no line breaks, no '#' (NCCL reads the rest of the line as a comment).
NcclValue = Annotated[str, _matching(_pattern(r"[^\n\r#]{1,256}"), "must be one line of text without '#'", 256)]
CsiDriverName = Annotated[
    str, _valid(is_dns_subdomain, "must be a CSI driver name such as 'lustre-csi.hpe.com' (at most 63 characters)", 63)
]
SecretKey = Annotated[
    str,
    _valid(
        lambda v: bool(_SECRET_KEY.fullmatch(v)) and v not in (".", "..") and not v.startswith(".."),
        "must be a Secret key: letters, digits, '-', '_' and '.', not '.' or '..'",
    ),
]
# 4096: hundreds of ranges; the node count itself is bounded where the expression is expanded.
HostlistExpression = Annotated[
    str, _matching(_HOSTLIST, "must be a Slurm hostlist of node names such as 'gpu-[001-064]'", 4096)
]


def image_is_pinned(reference: str) -> bool:
    """True when the reference names an exact tag (not 'latest') or a digest."""
    match = _IMAGE.fullmatch(reference)
    if not match:
        return False
    tag = match.group("tag")
    return bool(match.group("digest")) or (tag is not None and tag != "latest")


# A Slurm image's tag that starts with the Slurm release: SchedMD's Slinky images are tagged both
# "25.11.6-ubuntu24.04" (one patch release) and "25.11-ubuntu24.04" (moved to each patch release as it
# ships: SlinkyProject/containers schedmd/slurm/docker-bake.hcl, format_tag); this project's are "22.05".
_SLURM_TAG = re.compile(r"(?P<release>[0-9]{2}\.[0-9]{2})(?P<patch>\.[0-9]+)?([-_].*)?")


def _slurm_tag(reference: str) -> tuple[re.Match[str], re.Match[str]] | None:
    """The reference's match and its tag's as a Slurm tag, or None for a tag that names no release."""
    match = _IMAGE.fullmatch(reference)
    tag = _SLURM_TAG.fullmatch(match.group("tag") or "") if match else None
    return (match, tag) if tag else None


def image_slurm_release(reference: str) -> str | None:
    """The Slurm release ('25.11') a Slurm image's tag starts with, or None for a tag that names none."""
    parsed = _slurm_tag(reference)
    return parsed[1].group("release") if parsed else None


def image_slurm_patch(reference: str) -> int | None:
    """The Slurm patch level (6 of '25.11.6-ubuntu24.04') a Slurm image's tag names, or None for a tag that names none."""
    parsed = _slurm_tag(reference)
    patch = parsed[1].group("patch") if parsed else None
    return int(patch[1:]) if patch else None


def image_follows_patch_releases(reference: str) -> bool:
    """True for a Slurm image by a release tag without a patch level and no digest ('25.11-ubuntu24.04'):
    the image behind it changes with every patch release."""
    parsed = _slurm_tag(reference)
    return bool(parsed) and not parsed[1].group("patch") and not parsed[0].group("digest")


# ------------------------------------------------------------------------- secrets

SHOWN_SECRET = "[secret]"
"""How every secret of the config is shown: in repr, str, dumps and error messages."""
ENCRYPTED_PLACEHOLDER = "[encrypted in the stack file: pulumi up decrypts it]"
"""What the offline tools use in place of a ``secure:`` value they cannot decrypt."""


def is_encrypted(value: Any) -> bool:
    """A stack file's encrypted value as YAML reads it: ``{secure: v1:...}`` (``pulumi config set --secret``)."""
    return isinstance(value, Mapping) and list(value) == ["secure"] and isinstance(value["secure"], str)


class SecretText:
    """Secret text from the stack config: ``[secret]`` in every repr, str, dump and error.

    ``reveal()`` is the only way to the text, for ``pulumi.Output.secret`` and a Kubernetes Secret.
    Accepts plain text (what the engine hands the program, secret or not) and, for the offline tools,
    an encrypted ``{secure: ...}`` value, which only the Pulumi CLI can decrypt: it becomes
    ``encrypted``, with ENCRYPTED_PLACEHOLDER as its text, so nothing ever shows the ciphertext.
    """

    __slots__ = ("_text", "encrypted")

    def __init__(self, text: str, encrypted: bool = False):
        self._text = text
        self.encrypted = encrypted

    def reveal(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return SHOWN_SECRET

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretText) and (self._text, self.encrypted) == (other._text, other.encrypted)

    def __hash__(self) -> int:
        return hash((SecretText, self._text, self.encrypted))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate, serialization=core_schema.plain_serializer_function_ser_schema(repr)
        )

    @classmethod
    def _validate(cls, value: Any) -> SecretText:
        # No message quotes the value; the loader shows it as [secret] too (config.loader).
        if isinstance(value, SecretText):
            return value
        if is_encrypted(value):
            return cls(ENCRYPTED_PLACEHOLDER, encrypted=True)
        if not isinstance(value, str):
            raise ValueError("must be text (quote it in YAML)")
        return cls(value)


def _secret_matching(pattern: re.Pattern[str], message: str, max_length: int) -> AfterValidator:
    """Like _matching, for a secret's text; an encrypted value is checked once the engine decrypts it."""

    def check(secret: SecretText) -> SecretText:
        text = secret.reveal()
        if not secret.encrypted and (len(text) > max_length or not pattern.fullmatch(text)):
            raise ValueError(message)
        return secret

    return AfterValidator(check)


StoragePassword = Annotated[
    SecretText,
    _secret_matching(
        _STORAGE_PASS,
        "must be 1 to 256 characters of printable ASCII without spaces, '#', '\\' or '\"'"
        " (slurmdbd.conf would read them as a comment, an escape or a quote)",
        256,
    ),
]
