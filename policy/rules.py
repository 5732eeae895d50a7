"""The cluster's invariants as plain functions over Kubernetes manifests.

Every rule takes a :class:`Resource` (a manifest as a dict, plus the Pulumi
``protect`` option) and the pack :class:`Settings`, and returns the list of
violation messages (empty when the resource complies). The same functions are
used by the CrossGuard pack (``policy/__main__.py``), by the offline check
(``python -m dualsched.policy.offline``) and by the unit tests; nothing here imports
Pulumi.

Settings come from the stack's own dualsched config, as dualsched-policy takes them from the stack file
(:meth:`Settings.from_stack`: the engine hands a pack the stack's config), and the pack config may override
each (per policy, see ``PulumiPolicy.yaml``). The Slurm namespace cannot be derived from a single resource,
so it is configuration rather than a guess from Pod Security labels: a namespace labelled privileged is not
necessarily the Slurm one, and the Namespace object is not visible to a resource policy that validates a
DaemonSet.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping, Optional

GPU_RESOURCE = "nvidia.com/gpu"
NAME_LABEL = "app.kubernetes.io/name"
SLURMD = "slurmd"
DEFAULT_NAMESPACE = "default"

# Kinds that carry a pod template, and where it is.
_POD_KINDS = {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController", "Job", "CronJob"}
# Workloads whose pods hold a database; they are "stateful" for the prod protect rule.
DATABASE_NAMES = {"mariadb", "mysql", "postgres", "postgresql"}


# ---------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Settings:
    """Pack configuration shared by every rule (camelCase keys in the pack config)."""

    slurm_namespace: str = "slurm"
    """Namespace of the Slurm daemons; the only place slurmd may be privileged."""
    slurm_taint_key: str = "dualsched.io/slurm"
    """Taint key marking Slurm-owned nodes; no pod outside the Slurm namespace may tolerate it."""
    pool_label: str = "dualsched.io/pool"
    """Node label naming the pool; GPU pods must select on it."""
    gpu_pools: tuple[str, ...] = ()
    """Pools that have GPUs; empty means every value of the pool label is a GPU pool."""
    environment: str = "dev"
    """'prod' turns on the prod-only rules (pinned images, protect, Retain)."""

    CONFIG_KEYS = {
        "slurmNamespace": "slurm_namespace",
        "slurmTaintKey": "slurm_taint_key",
        "poolLabel": "pool_label",
        "gpuPools": "gpu_pools",
        "environment": "environment",
    }

    @classmethod
    def from_config(cls, config: Optional[Mapping[str, Any]], base: Optional["Settings"] = None) -> "Settings":
        """``base`` (the defaults without one) with what the pack config sets."""
        values = {}
        for key, attribute in cls.CONFIG_KEYS.items():
            value = (config or {}).get(key)
            if value is None:
                continue
            values[attribute] = tuple(value) if attribute == "gpu_pools" else str(value)
        return replace(base or cls(), **values)

    @classmethod
    def from_stack(cls, stack_config: Mapping[str, str], key: str = "dualsched") -> "Settings":
        """The settings of the stack being previewed, from its config as the engine hands it to a pack
        ('<namespace>:<name>' -> text, objects as JSON), taken as dualsched-policy takes them from the stack file
        (policy/offline.py, settings_for) at the same config key; what the config leaves out keeps the default.
        The program has validated the config: this only reads it."""
        return cls.of(dualsched_config(stack_config, key) or {})

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> "Settings":
        """The settings a dualsched config (camelCase or snake_case fields) gives; the defaults for what it leaves out."""
        slurm, placement, pools = config.get("slurm") or {}, config.get("placement") or {}, config.get("pools") or []
        values = {
            "environment": config.get("environment"),
            "slurm_namespace": _field(slurm, "namespace"),
            "slurm_taint_key": _field(placement, "slurmTaintKey"),
            "pool_label": _field(placement, "poolLabel"),
            "gpu_pools": tuple(pool["name"] for pool in pools if (_field(pool, "gpusPerNode") or 0) > 0) if pools else None,
        }
        return replace(cls(), **{attribute: v for attribute, v in values.items() if v is not None})

    @property
    def prod(self) -> bool:
        return self.environment == "prod"


def dualsched_config(stack_config: Mapping[str, str], key: str = "dualsched") -> Optional[dict[str, Any]]:
    """The dualsched config in a stack's config as the engine hands it to a pack, at ``key`` as dualsched-policy's
    --config-key names it: every '<namespace>:<field>' of a namespace, or the one object at '<namespace>:<key>'.
    None when there is nothing there."""

    def decoded(text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            return text  # a plain string, as `pulumi config set` stores one

    if ":" in key:
        value = decoded(stack_config[key]) if key in stack_config else None
        return value if isinstance(value, dict) else None
    prefix = f"{key}:"
    fields = {name[len(prefix):]: decoded(text) for name, text in stack_config.items() if name.startswith(prefix)}
    return fields or None


def _field(mapping: Mapping[str, Any], camel: str) -> Any:
    """A config field by its camelCase name or its snake_case one (the config takes both)."""
    return mapping.get(camel, mapping.get(re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()))


@dataclass(frozen=True)
class Resource:
    """What a rule sees: the manifest, and the resource options the engine knows."""

    manifest: Mapping[str, Any]
    protect: bool = False
    pulumi_name: str = ""

    @property
    def kind(self) -> str:
        return self.manifest.get("kind") or ""

    @property
    def namespace(self) -> str:
        return (self.manifest.get("metadata") or {}).get("namespace") or DEFAULT_NAMESPACE

    @property
    def label(self) -> str:
        metadata = self.manifest.get("metadata") or {}
        name = metadata.get("name") or self.pulumi_name or "?"
        where = f"{metadata['namespace']}/" if metadata.get("namespace") else ""
        return f"{self.kind} {where}{name}"


# -------------------------------------------------------------------------- helpers


def pod_template(manifest: Mapping[str, Any]) -> Optional[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(pod metadata, pod spec) of a pod or of a workload's template; None for other kinds."""
    kind = manifest.get("kind")
    if kind not in _POD_KINDS:
        return None
    if kind == "Pod":
        return manifest.get("metadata") or {}, manifest.get("spec") or {}
    spec = manifest.get("spec") or {}
    if kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    template = spec.get("template") or {}
    return template.get("metadata") or {}, template.get("spec") or {}


def containers(pod_spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod_spec.get(key) or []


def _gpu(resources: Optional[Mapping[str, Any]], which: str) -> Any:
    return ((resources or {}).get(which) or {}).get(GPU_RESOURCE)


def is_slurmd_pod(resource: Resource, pod_labels: Mapping[str, Any], settings: Settings) -> bool:
    """slurmd: labelled app.kubernetes.io/name=slurmd AND in the Slurm namespace (never a system one)."""
    return (
        pod_labels.get(NAME_LABEL) == SLURMD
        and resource.namespace == settings.slurm_namespace
        and not is_reserved_namespace(resource.namespace)
    )


# Kept in step with config/types.py (the pack runs without the project's packages):
# namespaces Kubernetes runs itself, and the label/taint prefixes it reserves, subdomains
# included (the NodeRestriction admission plugin's isKubernetesLabel).
RESERVED_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
RESERVED_KEY_DOMAINS = ("kubernetes.io", "k8s.io")
NODE_ISOLATION_PREFIX = "node-restriction.kubernetes.io"
"""The one reserved prefix that is the cluster admin's: labels for node isolation, which the NodeRestriction
admission plugin keeps kubelets from setting on their own Node (the node keeper's guarded pool label)."""


# Kept in step with components/node_keeper.py: the node keeper's ConfigMap, whose desired state names
# the taints it sets on the pools' nodes. The program sets no Node's spec.taints itself any more.
NODE_KEEPER = "node-keeper"
NODE_KEEPER_STATE = "desired.json"


def is_reserved_namespace(name: str) -> bool:
    return name in RESERVED_NAMESPACES or name.startswith("kube-")


def is_reserved_key(key: str) -> bool:
    prefix = key.rpartition("/")[0]
    if prefix == NODE_ISOLATION_PREFIX:
        return False
    return any(prefix == domain or prefix.endswith("." + domain) for domain in RESERVED_KEY_DOMAINS)


# ---------------------------------------------------------------------------- rules


PRIVILEGE_EQUIVALENT = frozenset({"SYS_ADMIN", "ALL"})
"""Capabilities that amount to privileged: SYS_ADMIN mounts, changes cgroups and device rules."""


def privileged_only_slurmd(resource: Resource, settings: Settings) -> list[str]:
    """Privileged containers, CAP_SYS_ADMIN and hostNetwork only in the Slurm namespace's slurmd pods."""
    pod = pod_template(resource.manifest)
    if pod is None:
        return []
    pod_metadata, pod_spec = pod
    if is_slurmd_pod(resource, pod_metadata.get("labels") or {}, settings):
        return []
    problems = []
    if pod_spec.get("hostNetwork"):
        problems.append(
            f"{resource.label}: hostNetwork is allowed only for slurmd pods "
            f"(label {NAME_LABEL}={SLURMD}) in the Slurm namespace '{settings.slurm_namespace}'"
        )
    for container in containers(pod_spec):
        context = container.get("securityContext") or {}
        added = {str(c).upper().removeprefix("CAP_") for c in (context.get("capabilities") or {}).get("add") or []}
        if context.get("privileged") or added & PRIVILEGE_EQUIVALENT:
            what = "is privileged" if context.get("privileged") else f"adds {', '.join(sorted(added & PRIVILEGE_EQUIVALENT))}"
            problems.append(
                f"{resource.label}: container '{container.get('name')}' {what}; privileged containers and "
                f"{'/'.join(sorted(PRIVILEGE_EQUIVALENT))} are allowed only in slurmd pods (label {NAME_LABEL}={SLURMD}) "
                f"in the Slurm namespace '{settings.slurm_namespace}'"
            )
    return problems


def tolerates_slurm_taint(toleration: Mapping[str, Any], taint_key: str) -> bool:
    """True if the toleration matches the Slurm taint (by key, or an empty key with Exists)."""
    key = toleration.get("key")
    if key == taint_key:
        return True
    return not key and toleration.get("operator") == "Exists"


def no_slurm_toleration_outside_slurm(resource: Resource, settings: Settings) -> list[str]:
    """No pod outside the Slurm namespace tolerates the Slurm taint."""
    pod = pod_template(resource.manifest)
    if pod is None or resource.namespace == settings.slurm_namespace:
        return []
    _, pod_spec = pod
    return [
        f"{resource.label}: tolerates the Slurm taint '{settings.slurm_taint_key}' "
        f"(toleration {dict(toleration)}); only pods in the Slurm namespace '{settings.slurm_namespace}' may run on "
        "Slurm-owned nodes"
        for toleration in pod_spec.get("tolerations") or []
        if tolerates_slurm_taint(toleration, settings.slurm_taint_key)
    ]


def _pools_selected(pod_spec: Mapping[str, Any], pool_label: str) -> Optional[set[str]]:
    """The pools a pod is confined to by nodeSelector or required node affinity; None if unconstrained."""
    selector = pod_spec.get("nodeSelector") or {}
    if pool_label in selector:
        return {str(selector[pool_label])}
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    pools: set[str] = set()
    for term in terms:  # terms are ORed: every one of them must pin the pool
        pinned = [
            expression
            for expression in term.get("matchExpressions") or []
            if expression.get("key") == pool_label and expression.get("operator") == "In"
        ]
        if not pinned:
            return None
        pools.update(str(value) for expression in pinned for value in expression.get("values") or [])
    return pools if terms else None


def gpu_limits_and_pools(resource: Resource, settings: Settings) -> list[str]:
    """Containers requesting nvidia.com/gpu set it as a limit; GPU pods run only on GPU pools."""
    pod = pod_template(resource.manifest)
    if pod is None:
        return []
    _, pod_spec = pod
    problems, gpu_pod = [], False
    for container in containers(pod_spec):
        request, limit = _gpu(container.get("resources"), "requests"), _gpu(container.get("resources"), "limits")
        gpu_pod = gpu_pod or bool(request) or bool(limit)
        if request is not None and limit is None:
            problems.append(
                f"{resource.label}: container '{container.get('name')}' requests {GPU_RESOURCE}={request} without a "
                f"limit; set resources.limits['{GPU_RESOURCE}'] (GPUs cannot be overcommitted)"
            )
        elif request is not None and str(request) != str(limit):
            problems.append(
                f"{resource.label}: container '{container.get('name')}' requests {GPU_RESOURCE}={request} but limits "
                f"it to {limit}; request and limit must be equal"
            )
    if not gpu_pod:
        return problems
    pools = _pools_selected(pod_spec, settings.pool_label)
    if pools is None:
        problems.append(
            f"{resource.label}: uses GPUs but is not confined to a GPU pool; add a nodeSelector or a required node "
            f"affinity on '{settings.pool_label}'"
        )
    elif settings.gpu_pools and not pools <= set(settings.gpu_pools):
        problems.append(
            f"{resource.label}: uses GPUs but may run on pools {sorted(pools - set(settings.gpu_pools))} which are "
            f"not GPU pools {list(settings.gpu_pools)}"
        )
    return problems


def kept_pools(manifest: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pools of the node keeper's desired state; none for other objects."""
    labels = (manifest.get("metadata") or {}).get("labels") or {}
    state = (manifest.get("data") or {}).get(NODE_KEEPER_STATE)
    if manifest.get("kind") != "ConfigMap" or labels.get(NAME_LABEL) != NODE_KEEPER or not isinstance(state, str):
        return []
    return json.loads(state)["pools"]


def kept_taints(manifest: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The taints the node keeper's ConfigMap would set on nodes (static and window); none for other objects."""
    pools = kept_pools(manifest)
    return [*(t for pool in pools for t in pool["taints"]), *(pool["window"]["taint"] for pool in pools if pool["window"])]


def node_keys(resource: Resource) -> list[tuple[str, Any]]:
    """(label or taint, key) of what the resource puts on nodes: a Node's labels and taints (an earlier
    version's NodePatch), the node keeper's labels and taints."""
    if resource.kind == "Node":
        labels = (resource.manifest.get("metadata") or {}).get("labels") or {}
        taints = (resource.manifest.get("spec") or {}).get("taints") or []
    else:
        labels = {key: None for pool in kept_pools(resource.manifest) for key in pool.get("labels") or {}}
        taints = kept_taints(resource.manifest)
    return [("label", key) for key in labels] + [("taint", taint.get("key")) for taint in taints]


def no_system_namespaces_or_keys(resource: Resource, settings: Settings) -> list[str]:
    """Nothing in Kubernetes' own namespaces; no node label or taint under its reserved prefixes."""
    metadata = resource.manifest.get("metadata") or {}
    problems = []
    namespace = metadata.get("name") if resource.kind == "Namespace" else metadata.get("namespace")
    if isinstance(namespace, str) and is_reserved_namespace(namespace):
        problems.append(
            f"{resource.label}: namespace {namespace!r} is Kubernetes' own (default, kube-system, kube-public, "
            "kube-*); the stack's objects belong in its own namespaces"
        )
    problems += [
        f"{resource.label}: {what} {key!r} is under a prefix Kubernetes reserves for itself (kubernetes.io/, "
        "k8s.io/ and their subdomains); use the stack's own prefix"
        for what, key in node_keys(resource)
        if isinstance(key, str) and is_reserved_key(key)
    ]
    return problems


# Secret material heuristics ------------------------------------------------------------

_SECRET_NAME = re.compile(r"(pass(word|wd)?|secret|token|credential|api[_.-]?key|private[_.-]?key|(^|[_.-])key)$", re.I)
_PEM_PRIVATE = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
# A munge key (or any random key) as base64: a long unbroken run of the base64 alphabet.
_BLOB = re.compile(r"^(?:[A-Za-z0-9+/]{43,}|[A-Za-z0-9_-]{43,})={0,2}$")
_FLAG = re.compile(r"^(0|1|true|false|yes|no|on|off)$", re.I)
# The rest of a passwd or group line after its name: the password field is the "x" placeholder.
_ACCOUNT_ENTRY = re.compile(r"^x:\d+:")
# Slurm's own password options (slurm.conf / slurmdbd.conf): StoragePass, AccountingStoragePass, JobCompPass.
_CONF_LINE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_.-]*)\s*[=:]\s*(\S.*?)\s*$")
# A program's assignment from a call or a subscript (`token = mint(key, user)`), not a literal:
# the programs dualsched ships in ConfigMaps handle tokens without containing any.
_CODE_EXPRESSION = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*\s*[(\[]")


def looks_like_blob(value: str) -> bool:
    """A long base64-like token (a munge key, a random password), not a word, a path or a digest.

    Pure lowercase hex (sha256 digests, config hashes) is not flagged unless very long.
    """
    if not _BLOB.match(value):
        return False
    if len(value) >= 128:
        return True
    if re.fullmatch(r"[0-9a-f]+", value):
        return False
    classes = sum(bool(re.search(pattern, value)) for pattern in (r"[a-z]", r"[A-Z]", r"[0-9]"))
    return classes >= 2


def _harmless(value: str) -> bool:
    """Values that are not secret material even under a secret-sounding name."""
    value = value.strip().strip("'\"")
    return (
        not value
        or bool(_FLAG.match(value) or _ACCOUNT_ENTRY.match(value))
        or value.startswith(("/", "$(", "${"))
        or value.startswith("file:")
        or bool(_CODE_EXPRESSION.match(value))
    )


def secret_value_problem(name: str, value: Any) -> Optional[str]:
    """Why ``name: value`` looks like secret material, or None."""
    if not isinstance(value, str):
        return None
    if _PEM_PRIVATE.search(value):
        return "holds a PEM private key"
    if _SECRET_NAME.search(name) and not _harmless(value):
        return "has a secret-like name and a literal value"
    if looks_like_blob(value.strip()):
        return "holds a key-like base64 blob"
    for line in value.splitlines() if "\n" in value else ():
        match = _CONF_LINE.match(line)
        if match and _SECRET_NAME.search(match.group(1)) and not _harmless(match.group(2)):
            return f"sets '{match.group(1)}' to a literal value"
        if looks_like_blob(line.strip()):
            return "holds a key-like base64 blob"
    return None


def no_secret_material(resource: Resource, settings: Settings) -> list[str]:
    """No secret material in ConfigMaps or in container env literals (use Secrets and secretKeyRef)."""
    problems = []
    if resource.kind == "ConfigMap":
        for key, value in (resource.manifest.get("data") or {}).items():
            why = secret_value_problem(key, value)
            if why:
                problems.append(f"{resource.label}: data key '{key}' {why}; keep secret material in a Secret")
        for key in resource.manifest.get("binaryData") or {}:
            if _SECRET_NAME.search(key):
                problems.append(f"{resource.label}: binaryData key '{key}' looks like a key or credential; use a Secret")
    pod = pod_template(resource.manifest)
    if pod is not None:
        for container in containers(pod[1]):
            for variable in container.get("env") or []:
                if "value" not in variable:
                    continue
                why = secret_value_problem(str(variable.get("name", "")), variable.get("value"))
                if why:
                    problems.append(
                        f"{resource.label}: env {variable.get('name')} of container '{container.get('name')}' {why}; "
                        "use valueFrom.secretKeyRef"
                    )
    return problems


# Prod-only rules ------------------------------------------------------------------------


def image_problem(image: Any) -> Optional[str]:
    """Why an image reference is not pinned, or None (digest, or a tag that is not 'latest')."""
    if not isinstance(image, str) or not image:
        return "has no image"
    if "@sha256:" in image:
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "has no tag (implicitly :latest)"
    if last.rsplit(":", 1)[1] == "latest":
        return "uses the tag 'latest'"
    return None


def images_pinned(resource: Resource, settings: Settings) -> list[str]:
    """In prod, every image is pinned by tag or digest, never 'latest'."""
    pod = pod_template(resource.manifest)
    if not settings.prod or pod is None:
        return []
    problems = []
    for container in containers(pod[1]):
        why = image_problem(container.get("image"))
        if why:
            problems.append(
                f"{resource.label}: container '{container.get('name')}' image '{container.get('image')}' {why}; "
                "pin a release tag or a digest in prod"
            )
    return problems


def is_stateful(resource: Resource) -> bool:
    """State claims, PVs and database StatefulSets: what prod must protect."""
    if resource.kind in ("PersistentVolumeClaim", "PersistentVolume"):
        return True
    if resource.kind == "StatefulSet":
        pod = pod_template(resource.manifest) or ({}, {})
        names = {(resource.manifest.get("metadata") or {}).get("labels", {}).get(NAME_LABEL), (pod[0].get("labels") or {}).get(NAME_LABEL)}
        return bool(names & DATABASE_NAMES) or bool((resource.manifest.get("spec") or {}).get("volumeClaimTemplates"))
    return False


def stateful_protected(resource: Resource, settings: Settings) -> list[str]:
    """In prod, claims, PVs and database StatefulSets carry the Pulumi protect option."""
    if not settings.prod or not is_stateful(resource) or resource.protect:
        return []
    return [f"{resource.label}: holds state but is not protected; set protect=True on it in prod"]


def pv_reclaim_retain(resource: Resource, settings: Settings) -> list[str]:
    """In prod, PersistentVolumes set persistentVolumeReclaimPolicy: Retain explicitly."""
    if not settings.prod or resource.kind != "PersistentVolume":
        return []
    policy = (resource.manifest.get("spec") or {}).get("persistentVolumeReclaimPolicy")
    if policy == "Retain":
        return []
    return [f"{resource.label}: persistentVolumeReclaimPolicy is {policy!r}; prod volumes must set 'Retain'"]


# ----------------------------------------------------------------------------- table


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    check: Callable[[Resource, Settings], list[str]]
    prod_only: bool = False


RULES: tuple[Rule, ...] = (
    Rule(
        "privileged-only-slurmd",
        "Privileged containers, CAP_SYS_ADMIN and hostNetwork only in the Slurm namespace's slurmd pods.",
        privileged_only_slurmd,
    ),
    Rule(
        "no-slurm-toleration-outside-slurm",
        "No pod outside the Slurm namespace tolerates the Slurm taint.",
        no_slurm_toleration_outside_slurm,
    ),
    Rule(
        "gpu-limits-and-pools",
        "Every container requesting nvidia.com/gpu sets it as a limit, and GPU pods run only on GPU pools.",
        gpu_limits_and_pools,
    ),
    Rule(
        "no-system-namespaces-or-keys",
        "Nothing in Kubernetes' own namespaces; no node label or taint under kubernetes.io/ or k8s.io/.",
        no_system_namespaces_or_keys,
    ),
    Rule(
        "no-secret-material",
        "No secret material in ConfigMaps or container env literals.",
        no_secret_material,
    ),
    Rule("prod-images-pinned", "In prod, images are pinned by tag or digest, never 'latest'.", images_pinned, True),
    Rule(
        "prod-stateful-protected",
        "In prod, PVCs, PVs and database StatefulSets are protected.",
        stateful_protected,
        True,
    ),
    Rule("prod-pv-reclaim-retain", "In prod, PersistentVolumes use reclaim policy Retain.", pv_reclaim_retain, True),
)


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str


def violations(resources: list[Resource], settings: Settings) -> list[Violation]:
    """Every rule over every resource."""
    return [Violation(rule.name, message) for resource in resources for rule in RULES for message in rule.check(resource, settings)]


# The JSON schema of the pack config, shared by every policy (see __main__.py).
# No defaults: a key the pack config leaves out is the stack's own (Settings.from_stack).
CONFIG_SCHEMA: dict[str, dict[str, Any]] = {
    "slurmNamespace": {"type": "string", "description": "Namespace of the Slurm daemons."},
    "slurmTaintKey": {"type": "string", "description": "Taint key of Slurm-owned nodes."},
    "poolLabel": {"type": "string", "description": "Node label naming the pool."},
    "gpuPools": {
        "type": "array",
        "items": {"type": "string"},
        "description": "Pools with GPUs; empty means any pool-label value.",
    },
    "environment": {"type": "string", "enum": ["dev", "prod"], "description": "'prod' enables the prod rules."},
}
