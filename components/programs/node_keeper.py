"""Node keeper: keeps dualsched's labels and taints on its pools' nodes and never touches anyone else's.

Under server-side apply a Node's ``spec.taints`` is one atomic list, so a Pulumi NodePatch that sets
taints conflicts with every other writer (cloud GPU taints, ``kubectl taint``, cordon, the node
lifecycle controller's not-ready taints), and forcing it would wipe their taints. This program edits
the list instead. Every ``PASS_SECONDS``, for each pool node of the desired state (a file of its
ConfigMap: a new desired state is a new ConfigMap and a new pod), it GETs the Node and, when its
taints are not as wanted, PATCHes it (JSON merge patch carrying the resourceVersion it read: a 409
means someone wrote the node meanwhile, and the next pass tries again).

Labels are here too, so that no Pulumi resource exists per node (a NodePatch stores the whole Node in
the stack's state, which the engine rewrites at each step: docs/benchmark.md). They are a map, and
the merge patch names only the keys this program sets or removes.

A taint is identified by key and effect, as the API server does. The keeper owns a taint while it
wants it and, after that, until it has removed it: the ones it wants are recorded in the node's
``OWNED_ANNOTATION`` in the same write. So a taint dropped from the config, or the window taint at
the window's opening, goes away, and a taint it never set is never touched or moved. Labels likewise,
by key, in ``OWNED_LABELS_ANNOTATION``: a label it wants is set to the wanted value (whoever set it
before), a label it recorded and no longer wants is removed, any other label is never touched.

A node that leaves every pool is released: each pool node carries ``KEPT_BY_LABEL`` (one of the labels it
owns), each pass lists the nodes with it, and a listed node no pool names loses every label and taint the
keeper recorded, that label too. Its slurmd pod, with the munge key, goes with the pool label. The keeper
may patch such a node only to remove what it recorded there (components/node_keeper.py's admission policy).

Two stacks whose pools name the same node (a hostlist typo) would set their labels on it in turn, and its slurmd
pod, which selects ``KEPT_BY_LABEL``, would be replaced by the other stack's at each turn, killing its jobs. So each
keeper renews its ``LEASE`` (a coordination.k8s.io Lease in its namespace) every pass, and leaves alone a node that
another keeper keeps while that keeper's Lease is renewed: it logs the node and stays unready, so the second stack's
`pulumi up` fails and the first keeps the node. Once the other Lease is gone (its stack destroyed) or has not been
renewed for its ``leaseDurationSeconds`` (measured on this keeper's own clock from when it last saw the Lease change,
as client-go's leader election does, so no two clocks are compared), the node is taken over.

Desired state (JSON): ``{"keptBy": "<label selector>", "pools": [{"name", "nodes": [...], "labels": {key: value},
"taints": [{"key", "value", "effect"}], "window": null | {"startMinute", "durationMinutes", "taint": {...}},
"joinSelector"?: "<label selector>"}]}``. A time-shared pool's nodes carry the window taint while its daily window
(UTC) is closed. A pool with a ``joinSelector`` has as nodes those of its ``nodes`` (a bound) that the selector
matches, listed each pass: a node labelled into it (an autoscaler's template, `kubectl label`) joins it, and one
whose label is removed leaves it and is released.

Ready (``GET /readyz``) while the last pass found every existing node as wanted; a node that is not
in the cluster is logged, not waited for. ``GET /healthz`` answers while the process runs.

Run: ``python3 node_keeper.py`` with KEEPER_DESIRED_FILE and KEEPER_PORT.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping, NamedTuple, Optional, Protocol

OWNED_ANNOTATION = "dualsched.io/owned-taints"
"""The taints this program owns on the node (those it wants), as ``key:Effect,key:Effect`` (taint keys hold no ':' or ',')."""
OWNED_LABELS_ANNOTATION = "dualsched.io/owned-labels"
"""The label keys this program owns on the node (those it wants), as ``key,key`` (label keys hold no ',')."""
KEPT_BY_LABEL = "dualsched.io/kept-by"
"""On each node of a pool, the namespace of the keeper that keeps it: the nodes to release once no pool names them."""
FIELD_MANAGER = "dualsched-node-keeper"
LEASE = "dualsched-node-keeper"
"""The Lease each keeper renews in its own namespace: while it is renewed, no other keeper takes its nodes."""
LEASE_SECONDS = 600
"""How long a keeper may go without renewing before another takes its nodes: longer than its pod takes to be
replaced (a rollout, or a node lost and its pods evicted after the default 300 s)."""
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PASS_SECONDS = 10
"""One GET per pool node per pass: the rate at which each kubelet renews its node lease."""
REQUEST_SECONDS = 10
MINUTES_PER_DAY = 24 * 60

Taint = Mapping[str, str]
TaintId = tuple[str, str]
Log = Callable[[str], None]


def taint_id(taint: Taint) -> TaintId:
    return taint["key"], taint["effect"]


def describe(taint: Taint) -> str:
    """As ``kubectl taint`` writes it: key=value:Effect."""
    return f"{taint['key']}={taint.get('value', '')}:{taint['effect']}"


def window_open(start_minute: int, duration_minutes: int, now: datetime) -> bool:
    """Inside the daily window [start, start + duration) in UTC; a window may cross midnight."""
    utc = now.astimezone(timezone.utc)
    return (utc.hour * 60 + utc.minute - start_minute) % MINUTES_PER_DAY < duration_minutes


def wanted_taints(pool: Mapping, now: datetime) -> list[Taint]:
    """The pool's static taints, and the window taint while a time-shared pool's window is closed."""
    window = pool.get("window")
    closed = window is not None and not window_open(window["startMinute"], window["durationMinutes"], now)
    return [*pool["taints"], *([window["taint"]] if closed else [])]


class Wanted(NamedTuple):
    """What one node should carry now."""

    labels: Mapping[str, str]
    taints: list[Taint]


RELEASED = Wanted({}, [])
"""What a node that left every pool should carry of the keeper's: nothing."""


def members(pool: Mapping, joined: Mapping[str, set[str]]) -> list[str]:
    """A pool's nodes: those it names, or for a pool whose nodes join by label, those of its bound that carry the label."""
    if "joinSelector" not in pool:
        return pool["nodes"]
    return [node for node in pool["nodes"] if node in joined[pool["name"]]]


def wanted_by_node(desired: Mapping, now: datetime, joined: Mapping[str, set[str]]) -> dict[str, Wanted]:
    return {node: Wanted(pool["labels"], wanted_taints(pool, now)) for pool in desired["pools"] for node in members(pool, joined)}


def owned(annotations: Mapping[str, str]) -> set[TaintId]:
    """The taints recorded as this program's on an earlier pass."""
    recorded = annotations.get(OWNED_ANNOTATION) or ""
    return {tuple(item.rsplit(":", 1)) for item in recorded.split(",") if ":" in item}


def ownership_record(wanted: list[Taint]) -> Optional[str]:
    """The annotation value for the taints wanted now; None (no annotation) when there are none."""
    return ",".join(f"{key}:{effect}" for key, effect in sorted({taint_id(t) for t in wanted})) or None


def _as_set(taint: Taint, now: datetime) -> dict[str, str]:
    """A taint to add; like ``kubectl taint``, a NoExecute taint records when it was added."""
    added = {"key": taint["key"], "value": taint.get("value", ""), "effect": taint["effect"]}
    if taint["effect"] == "NoExecute":
        added["timeAdded"] = now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return added


def merge(current: list[Taint], wanted: list[Taint], owned_ids: set[TaintId], now: datetime) -> list[Taint]:
    """The node's new taints: every taint it does not own, untouched and in place; each it owns and
    wants, in place (with the wanted value); each it owns and no longer wants, gone; then the wanted
    ones the node lacks, in the desired order."""
    missing = {taint_id(t): t for t in wanted}
    ours = owned_ids | set(missing)
    merged: list[Taint] = []
    for taint in current:
        identity = taint_id(taint)
        if identity not in ours:
            merged.append(taint)
        elif identity in missing:
            want = missing.pop(identity)
            merged.append(taint if taint.get("value", "") == want.get("value", "") else _as_set(want, now))
    return merged + [_as_set(t, now) for t in missing.values()]


def owned_labels(annotations: Mapping[str, str]) -> set[str]:
    """The label keys recorded as this program's on an earlier pass."""
    return {key for key in (annotations.get(OWNED_LABELS_ANNOTATION) or "").split(",") if key}


def label_changes(current: Mapping[str, str], wanted: Mapping[str, str], owned_keys: set[str]) -> dict[str, Optional[str]]:
    """The merge patch of the node's labels: each wanted label that differs, and None (remove) for each
    label it owns, no longer wants and the node still has. Every other label is left out: untouched."""
    changed: dict[str, Optional[str]] = {key: value for key, value in wanted.items() if current.get(key) != value}
    changed.update({key: None for key in sorted(owned_keys - set(wanted)) if key in current})
    return changed


def patch_for(node: Mapping, wanted: Wanted, now: datetime) -> Optional[dict]:
    """The merge patch that brings ``node`` to the wanted labels and taints, or None when it is already there."""
    metadata = node["metadata"]
    annotations = metadata.get("annotations") or {}
    current = (node.get("spec") or {}).get("taints") or []
    taints = merge(current, wanted.taints, owned(annotations), now)
    labels = label_changes(metadata.get("labels") or {}, wanted.labels, owned_labels(annotations))
    records = {OWNED_ANNOTATION: ownership_record(wanted.taints), OWNED_LABELS_ANNOTATION: ",".join(sorted(wanted.labels)) or None}
    stale_records = {key: value for key, value in records.items() if annotations.get(key) != value}
    if taints == current and not labels and not stale_records:
        return None
    # resourceVersion makes it conditional: the API server refuses it (409) if the node changed since the GET
    patch: dict = {"metadata": {"resourceVersion": metadata["resourceVersion"]}}
    if stale_records:
        patch["metadata"]["annotations"] = stale_records
    if labels:
        patch["metadata"]["labels"] = labels
    if taints != current:
        patch["spec"] = {"taints": taints or None}
    return patch


def changes(node: Mapping, patch: Mapping) -> list[str]:
    """What a patch does to the node's labels and taints, one line each."""
    lines = [
        f"label {key} removed" if value is None else f"label {key}={value} set"
        for key, value in (patch["metadata"].get("labels") or {}).items()
    ]
    if "spec" not in patch:
        return lines
    before = [describe(t) for t in (node.get("spec") or {}).get("taints") or []]
    after = [describe(t) for t in patch["spec"]["taints"] or []]
    return lines + [f"removed {t}" for t in before if t not in after] + [f"added {t}" for t in after if t not in before]


class NodeApi(Protocol):
    def node(self, name: str) -> Optional[dict]: ...

    def node_names(self, selector: str) -> list[str]: ...

    def patch_node(self, name: str, patch: Mapping) -> bool: ...

    def lease(self, namespace: str) -> Optional[dict]: ...

    def renew_lease(self, namespace: str, now: datetime) -> None: ...


class ApiServer:
    """The calls the keeper makes (nodes, and keepers' Leases), with the pod's own ServiceAccount token."""

    def __init__(self, url: str, token_file: str, ca_file: str):
        self.url, self.token_file = url, token_file
        self.context = ssl.create_default_context(cafile=ca_file)

    def _call(self, method: str, path: str, body: Optional[Mapping] = None) -> dict:
        with open(self.token_file) as token:  # the kubelet rotates it: read it each time
            bearer = token.read().strip()
        headers = {"Authorization": f"Bearer {bearer}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
        request = urllib.request.Request(
            f"{self.url}{path}", data=None if body is None else json.dumps(body).encode(), headers=headers, method=method
        )
        with urllib.request.urlopen(request, context=self.context, timeout=REQUEST_SECONDS) as response:
            return json.load(response)

    def node(self, name: str) -> Optional[dict]:
        """The Node, or None when there is none of that name."""
        try:
            return self._call("GET", f"/api/v1/nodes/{name}")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def node_names(self, selector: str) -> list[str]:
        """The names of the nodes that ``selector`` (a label selector) matches."""
        listed = self._call("GET", f"/api/v1/nodes?{urllib.parse.urlencode({'labelSelector': selector})}")
        return [item["metadata"]["name"] for item in listed["items"]]

    def patch_node(self, name: str, patch: Mapping) -> bool:
        """False when the node changed since it was read (409): try again on the next pass."""
        try:
            self._call("PATCH", f"/api/v1/nodes/{name}?fieldManager={FIELD_MANAGER}", patch)
            return True
        except urllib.error.HTTPError as error:
            if error.code == 409:
                return False
            raise

    def lease(self, namespace: str) -> Optional[dict]:
        """The keeper's Lease in ``namespace``, or None when there is none."""
        try:
            return self._call("GET", _lease_path(namespace))
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def renew_lease(self, namespace: str, now: datetime) -> None:
        """This keeper's own Lease: held by its namespace, renewed now."""
        self._call("PATCH", f"{_lease_path(namespace)}?fieldManager={FIELD_MANAGER}", renewal(now))


def _lease_path(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}"


def renewal(now: datetime) -> dict:
    """The merge patch that renews a keeper's Lease (renewTime is a MicroTime; its holder and duration are the
    stack's, set as it is created)."""
    return {"spec": {"renewTime": now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}


def log_line(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


REFUSED, NO_ANSWER = object(), object()
"""What a call came to when the API server refused it, or did not answer."""


class Keeper:
    """One pass over every pool node; remembers which nodes it already reported missing or left to another keeper,
    and each other keeper's Lease as it last saw it change."""

    def __init__(self, api: NodeApi, log: Log = log_line, clock: Callable[[], float] = time.monotonic):
        self.api, self.log, self.clock = api, log, clock
        self.missing: set[str] = set()
        self.left_alone: set[str] = set()
        self.leases_seen: dict[str, tuple[Optional[str], float]] = {}
        self.alive: dict[str, bool] = {}
        self.ready = False

    def keep(self, name: str, wanted: Wanted, now: datetime, own: str) -> bool:
        """Bring one node to its wanted labels and taints; True when it is there (or not in the cluster)."""
        node = self.api.node(name)
        if node is None:
            if wanted is not RELEASED and name not in self.missing:
                self.log(f"{name}: no such node (yet); its labels and taints are set once it joins")
                self.missing.add(name)
            return True
        self.missing.discard(name)
        holder = (node["metadata"].get("labels") or {}).get(KEPT_BY_LABEL)
        if wanted is not RELEASED and holder not in (None, own) and not self.may_take_from(name, holder):
            return False
        patch = patch_for(node, wanted, now)
        if patch is None:
            return True
        if not self.api.patch_node(name, patch):
            self.log(f"{name}: changed by someone else meanwhile, trying again on the next pass")
            return False
        if wanted is RELEASED:
            self.log(f"{name}: in no pool any more: released")
        for change in changes(node, patch):
            self.log(f"{name}: {change}")
        return True

    def may_take_from(self, name: str, holder: str) -> bool:
        """Whether a node the keeper of namespace ``holder`` keeps may be taken: only once that keeper is gone."""
        if self.holder_alive(holder):
            if name not in self.left_alone:
                self.log(f"{name}: kept by the node keeper of namespace {holder}, whose Lease is renewed: left alone "
                         f"(two stacks' pools name it; take it out of one, or destroy that stack)")
                self.left_alone.add(name)
            return False
        self.left_alone.discard(name)
        self.log(f"{name}: taken over from the node keeper of namespace {holder}, which has not renewed its Lease for "
                 f"{LEASE_SECONDS}s or has none")
        return True

    def holder_alive(self, holder: str) -> bool:
        """Whether ``holder``'s keeper renewed its Lease within its duration, on this keeper's clock (asked once a pass)."""
        if holder not in self.alive:
            self.alive[holder] = self._renewed_lately(holder, self.api.lease(holder))
        return self.alive[holder]

    def _renewed_lately(self, holder: str, lease: Optional[dict]) -> bool:
        if lease is None:
            self.leases_seen.pop(holder, None)
            return False
        spec = lease.get("spec") or {}
        renewed, at = spec.get("renewTime"), self.clock()
        seen = self.leases_seen.get(holder)
        if seen is None or seen[0] != renewed:
            self.leases_seen[holder] = (renewed, at)
            return True
        return at - seen[1] < spec.get("leaseDurationSeconds", LEASE_SECONDS)

    def run_pass(self, desired: Mapping, now: datetime) -> bool:
        """True when every node was as wanted at the end of the pass, the released ones too. Its own Lease is renewed
        first. A node (or the list of kept nodes, or the Lease) the API server refuses is logged and the pass goes on;
        when the API server does not answer, the pass stops there."""
        own = own_namespace(desired)
        self.alive = {}
        renewed = self.attempt("its Lease", lambda: self.api.renew_lease(own, now))
        listed = self.attempt("the list of kept nodes", lambda: self.released(desired))
        # Without the labelled nodes, a joined node would look released and lose its slurmd: nothing is changed.
        joined = self.attempt("the nodes labelled into pools", lambda: self.joined(desired))
        if NO_ANSWER in (renewed, listed, joined) or joined is REFUSED:
            return False
        complete = renewed is not REFUSED and listed is not REFUSED
        for name, wanted in {**(listed if listed is not REFUSED else {}), **wanted_by_node(desired, now, joined)}.items():
            done = self.attempt(name, lambda: self.keep(name, wanted, now, own))
            if done is NO_ANSWER:
                return False
            complete = done is True and complete
        return complete

    def attempt(self, subject: str, step: Callable[[], Any]) -> Any:
        """``step()``, or REFUSED or NO_ANSWER from the API server (each logged)."""
        try:
            return step()
        except urllib.error.HTTPError as error:
            self.log(f"{subject}: the API server refused: {error.code} {error.reason}")
            return REFUSED
        except (OSError, ValueError) as error:
            self.log(f"{subject}: no answer from the API server ({error}); the pass stops here")
            return NO_ANSWER

    def joined(self, desired: Mapping) -> dict[str, set[str]]:
        """For each pool whose nodes join by label, the nodes carrying it (one list a pool)."""
        return {pool["name"]: set(self.api.node_names(pool["joinSelector"])) for pool in desired["pools"] if "joinSelector" in pool}

    def released(self, desired: Mapping) -> dict[str, Wanted]:
        """The nodes this keeper kept that no pool names now (RELEASED each): listed by its label."""
        return {name: RELEASED for name in self.api.node_names(desired["keptBy"])}


def own_namespace(desired: Mapping) -> str:
    """The keeper's own namespace: the value of the label that marks its nodes (``keptBy``, ``<label>=<namespace>``)."""
    return desired["keptBy"].split("=", 1)[1]


def serve_health(port: int, keeper: Keeper) -> ThreadingHTTPServer:
    """/healthz while the process runs; /readyz while the last pass was complete."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/healthz":
                status = 200
            elif self.path == "/readyz":
                status = 200 if keeper.ready else 503
            else:
                status = 404
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_request(self, code="-", size="-") -> None:
            pass  # probes every few seconds would drown the changes

    server = ThreadingHTTPServer(("", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop(signum: int, frame: object) -> None:
    """The kubelet's SIGTERM: exit now. As its container's PID 1 the program would otherwise ignore it and
    go on patching, beside the pod that replaces it, until the SIGKILL after the grace period."""
    raise SystemExit(0)


def api_server_url(env: Mapping[str, str]) -> str:
    host = env["KUBERNETES_SERVICE_HOST"]
    return f"https://{f'[{host}]' if ':' in host else host}:{env['KUBERNETES_SERVICE_PORT']}"


def main() -> None:
    signal.signal(signal.SIGTERM, stop)
    env = os.environ
    with open(env["KEEPER_DESIRED_FILE"]) as state:
        desired = json.load(state)
    keeper = Keeper(ApiServer(api_server_url(env), f"{SERVICE_ACCOUNT_DIR}/token", f"{SERVICE_ACCOUNT_DIR}/ca.crt"))
    serve_health(int(env["KEEPER_PORT"]), keeper)
    nodes = sum(len(pool["nodes"]) for pool in desired["pools"])
    log_line(f"node keeper: {nodes} nodes in {len(desired['pools'])} pools, a pass every {PASS_SECONDS}s")
    while True:
        keeper.ready = keeper.run_pass(desired, datetime.now(timezone.utc))
        time.sleep(PASS_SECONDS)


if __name__ == "__main__":
    main()
