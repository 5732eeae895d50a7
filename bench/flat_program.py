"""The floor: a flat pulumi-kubernetes program, no components, the same objects as the library.

``capture(config)`` runs ``components.program.build`` once under the offline render's mocks
(components/render.py) and keeps, per custom resource, what the engine receives: type, name,
inputs exactly as registered (camelCase, as on the wire), protect / retainOnDelete / ignoreChanges,
and the dependencies (those of its own registration plus those of every component above it,
component URNs expanded to the custom resources under them, which is what makes a slurmd
DaemonSet wait for the node keeper's Deployment). The result is plain data (JSON).

``build(plan)`` registers those resources by direct constructors (``k8s.core.v1.ConfigMap(...)``,
``random.RandomBytes(...)``), in the same order, with the same options and explicit ``depends_on``.
Auto-named objects stay auto-named: a string that named one in the render (the render's stand-in
auto name) becomes that resource's real ``metadata.name`` output, and a generated secret value
becomes the Random resource's output, so the flat program deploys the same objects and wires them
the same way as the library.

"The same objects" are the same Kubernetes objects with the same specs, and nothing per node in
either program: the pools' node labels and taints are data of the node keeper's ConfigMap, which both
deploy identically and whose program writes them onto the nodes (components/node_keeper.py).

So the floor registers the same objects by construction (no hand-copied spec can drift from the
library, the mistake the old hand-written floor made). What it does not pay for: building the specs
(config validation, typed Args, components). Under mocks that is exactly the library's overhead;
through the real engine (bench/engine.py) it is the engine, provider and API-server cost of the
objects themselves. The capture is done before any clock starts, like the Slurm files were before.
"""

from __future__ import annotations

import re
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from dualsched.config.models import StackConfig

_REF = "$flat-ref"
_K8S_MODULES = {"core": k8s.core.v1, "apps": k8s.apps.v1, "networking": k8s.networking.v1, "rbac": k8s.rbac.v1,
                "policy": k8s.policy.v1, "autoscaling": k8s.autoscaling.v2, "batch": k8s.batch.v1,
                "storage": k8s.storage.v1, "scheduling": k8s.scheduling.v1, "admissionregistration": k8s.admissionregistration.v1,
                "coordination": k8s.coordination.v1}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _constructor(token: str):
    package, module, kind = token.split(":")
    if package == "random":
        return getattr(random, kind)
    group, version = module.split("/")
    return getattr(_K8S_MODULES[group.split(".")[0]], kind)


# ----------------------------------------------------------------------------- capture


def capture(config: StackConfig) -> dict[str, Any]:
    """What the library registers for ``config``, as plain data for ``build``."""
    from dualsched.components.render import _auto_name, render_config

    render = render_config(config)
    regs = render.registrations
    custom = [r for r in regs if r.custom]
    index = {r.urn: i for i, r in enumerate(custom)}
    by_urn = {r.urn: r for r in regs}
    children: dict[str, list[str]] = {}
    for r in regs:
        children.setdefault(r.parent, []).append(r.urn)

    def customs_under(urn: str) -> list[int]:
        found, stack = [], list(children.get(urn, ()))
        while stack:
            u = stack.pop()
            if u in index:
                found.append(index[u])
            stack.extend(children.get(u, ()))
        return found

    def expand(urns) -> set[int]:
        out: set[int] = set()
        for u in urns:
            out.update([index[u]] if u in index else customs_under(u))
        return out

    # stand-in auto names (render) -> the resource that will carry the real one
    tokens: dict[str, tuple[int, str]] = {}
    for i, r in enumerate(custom):
        if r.type.startswith("kubernetes:") and not (r.inputs.get("metadata") or {}).get("name"):
            tokens[_auto_name(r.name, f"{r.type}::{r.name}")] = (i, "name")
    # generated secret values -> the Random resource's output that carries them (by resource, not by order:
    # registrations and mock calls interleave differently from one render to the next)
    for i, r in enumerate(custom):
        for attr, value in render.generated.get((r.type, r.name), {}).items():
            tokens[value] = (i, attr)

    def mark(value: Any, refs: set[int]) -> Any:
        if isinstance(value, dict):
            return {k: mark(v, refs) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v, refs) for v in value]
        if isinstance(value, str):
            hits = [(tok, i, attr) for tok, (i, attr) in tokens.items() if tok in value]
            if hits:
                refs.update(i for _, i, _ in hits)
                return {_REF: value, "refs": [[tok, i, attr] for tok, i, attr in hits]}
        return value

    resources = []
    for i, r in enumerate(custom):
        deps = expand(r.dependencies)
        parent = r.parent
        while parent in by_urn:  # what a component waited for, each child waited for too
            deps |= expand(by_urn[parent].dependencies)
            parent = by_urn[parent].parent
        refs: set[int] = set()
        inputs = mark({k: v for k, v in r.inputs.items() if k not in ("apiVersion", "kind")}, refs)
        resources.append({
            "type": r.type, "name": r.name, "inputs": inputs, "has_refs": bool(refs),
            "protect": r.protect, "retain_on_delete": r.retain_on_delete, "ignore_changes": list(r.ignore_changes),
            "depends_on": sorted(deps - refs - {i}),
        })
    root = next(r.urn for r in regs if r.type == "dualsched:cluster:DualScheduledCluster")
    return {"resources": resources, "exports": render.component_outputs.get(root, {})}


# ------------------------------------------------------------------------------- build


def build(plan: dict[str, Any]) -> None:
    """Register the captured resources by direct constructors."""
    made: list[Any] = []

    def output(i: int, attr: str):
        res = made[i]
        return res.metadata.name if attr == "name" else getattr(res, attr)

    def resolve(value: Any) -> Any:
        if isinstance(value, dict):
            if _REF in value:
                text, refs = value[_REF], value["refs"]
                if len(refs) == 1 and refs[0][0] == text:
                    return output(refs[0][1], refs[0][2])

                def fill(values, text=text, refs=refs):
                    for (token, _, _), real in zip(refs, values):
                        text = text.replace(token, str(real))  # as the library's f-strings print it (None under mocks)
                    return text

                return pulumi.Output.all(*(output(i, attr) for _, i, attr in refs)).apply(fill)
            return {k: resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v) for v in value]
        return value

    for spec in plan["resources"]:
        inputs = resolve(spec["inputs"]) if spec["has_refs"] else spec["inputs"]
        opts = pulumi.ResourceOptions(
            protect=spec["protect"] or None,
            retain_on_delete=spec["retain_on_delete"] or None,
            ignore_changes=spec["ignore_changes"] or None,
            depends_on=[made[i] for i in spec["depends_on"]] or None,
        )
        made.append(_constructor(spec["type"])(spec["name"], opts=opts, **{_snake(k): v for k, v in inputs.items()}))
    for key, value in plan["exports"].items():
        pulumi.export(key, value)
