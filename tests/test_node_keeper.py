"""The node keeper: its program's decisions (which taints a node gets, and which it must never
touch), its calls to the API server, and the deployed parts (desired state, RBAC, Deployment).
Its work on a real node, next to foreign taints, is tests/node/test_node_taints.py."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

import pytest

from dualsched.components.node_keeper import KEEP_VERB, KEEPER_DIR, PROGRAM_FILE, RELEASE_ONLY, STATE_FILE, desired_state
from dualsched.components.programs import source
from dualsched.components.programs.node_keeper import (
    FIELD_MANAGER,
    KEPT_BY_LABEL,
    LEASE,
    LEASE_SECONDS,
    OWNED_ANNOTATION,
    OWNED_LABELS_ANNOTATION,
    ApiServer,
    Keeper,
    Wanted,
    label_changes,
    merge,
    owned,
    patch_for,
    renewal,
    serve_health,
    wanted_by_node,
    window_open,
)
from rendering import container, pod_spec, raw_stack, render_raw, render_stack, variant, with_joining_pool

SLURM = {"key": "dualsched.io/slurm", "value": "true", "effect": "NoSchedule"}
WINDOW = {"key": "dualsched.io/inference-window", "value": "closed", "effect": "NoExecute"}
FOREIGN = [
    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": "2025-01-01T00:00:00Z"},
    {"key": "example.com/maintenance", "value": "yes", "effect": "PreferNoSchedule"},
]
NOON = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)


def at(clock: str) -> datetime:
    hours, minutes = map(int, clock.split(":"))
    return NOON.replace(hour=hours, minute=minutes)


def node(taints: list[dict], owned_taints: Optional[str] = None, version: str = "7", labels: Optional[dict] = None,
         owned_labels: Optional[str] = None) -> dict[str, Any]:  # fmt: skip
    annotations = {OWNED_ANNOTATION: owned_taints} if owned_taints is not None else {}
    annotations |= {OWNED_LABELS_ANNOTATION: owned_labels} if owned_labels is not None else {}
    metadata = {"name": "gpu-001", "resourceVersion": version, "annotations": annotations, "labels": dict(labels or {})}
    return {"metadata": metadata, "spec": {"taints": taints}}


def taints_only(taints: list[dict]) -> Wanted:
    return Wanted({}, taints)


KEPT_BY = f"{KEPT_BY_LABEL}=slurm"
POOL_LABELS = {"dualsched.io/pool": "h100", "dualsched.io/mode": "dedicated", "dualsched.io/slurm-gpus": "8"}
THEIR_LABELS = {"kubernetes.io/hostname": "gpu-001", "nvidia.com/gpu.product": "H100"}


def time_shared(start_minute: int, duration: int, taints: tuple = ()) -> dict[str, Any]:
    return {"name": "shared", "nodes": ["gpu-001"], "labels": {}, "taints": list(taints),
            "window": {"startMinute": start_minute, "durationMinutes": duration, "taint": WINDOW}}  # fmt: skip


# ------------------------------------------------------------------ which taints a node gets


@pytest.mark.parametrize(
    "clock, is_open",
    [("08:59", False), ("09:00", True), ("12:00", True), ("16:59", True), ("17:00", False), ("23:59", False), ("00:00", False)],
)
def test_a_window_is_open_from_its_start_for_its_duration(clock, is_open):
    assert window_open(9 * 60, 480, at(clock)) is is_open


@pytest.mark.parametrize(
    "clock, is_open",
    [("21:59", False), ("22:00", True), ("23:59", True), ("00:00", True), ("07:59", True), ("08:00", False), ("12:00", False)],
)
def test_a_window_may_cross_midnight(clock, is_open):
    assert window_open(22 * 60, 600, at(clock)) is is_open


def test_windows_are_in_utc_whatever_the_clock_says():
    """09:00 in UTC+2 is 07:00 UTC: outside a window that opens at 08:00 UTC."""
    assert not window_open(8 * 60, 60, datetime(2025, 6, 1, 9, 0, tzinfo=timezone(timedelta(hours=2))))
    assert window_open(8 * 60, 60, datetime(2025, 6, 1, 10, 0, tzinfo=timezone(timedelta(hours=2))))


def test_a_closed_window_adds_its_taint_after_the_pools_own():
    dedicated = {"name": "dedicated", "nodes": ["gpu-002"], "labels": POOL_LABELS, "taints": [SLURM], "window": None}
    desired = {"keptBy": KEPT_BY, "pools": [time_shared(9 * 60, 480, taints=[SLURM]), dedicated]}
    assert wanted_by_node(desired, at("20:00"), {}) == {"gpu-001": Wanted({}, [SLURM, WINDOW]), "gpu-002": Wanted(POOL_LABELS, [SLURM])}
    assert wanted_by_node(desired, at("10:00"), {}) == {"gpu-001": Wanted({}, [SLURM]), "gpu-002": Wanted(POOL_LABELS, [SLURM])}


# ------------------------------------------------------------------ merge: never touch what is not ours


def test_foreign_taints_stay_untouched_and_in_place():
    current = [FOREIGN[0], {**SLURM, "value": "old"}, FOREIGN[1], {"key": "dualsched.io/gone", "value": "x", "effect": "NoSchedule"}, FOREIGN[2]]
    merged = merge(current, [SLURM, WINDOW], {("dualsched.io/slurm", "NoSchedule"), ("dualsched.io/gone", "NoSchedule")}, NOON)
    assert merged == [FOREIGN[0], SLURM, FOREIGN[1], FOREIGN[2], {**WINDOW, "timeAdded": "2025-06-01T12:00:00Z"}]
    assert merged[0] is FOREIGN[0] and merged[2] is FOREIGN[1] and merged[3] is FOREIGN[2]


def test_a_taint_it_never_set_is_never_removed_even_under_its_own_key():
    """A taint is its key and effect: someone's NoExecute under our key is theirs, and one we no longer
    want but never recorded was never ours."""
    theirs = [{**SLURM, "effect": "NoExecute"}, {**WINDOW, "value": "maintenance"}]
    assert merge(theirs, [SLURM], set(), NOON) == [*theirs, SLURM]
    assert merge(theirs, [], set(), NOON) == theirs


def test_only_the_taints_it_recorded_are_removed():
    current = [*FOREIGN, SLURM, WINDOW]
    assert merge(current, [SLURM], owned({OWNED_ANNOTATION: "dualsched.io/inference-window:NoExecute,dualsched.io/slurm:NoSchedule"}), NOON) == [*FOREIGN, SLURM]


def test_a_kept_no_execute_taint_keeps_its_time_added():
    current = [{**WINDOW, "timeAdded": "2025-05-31T17:00:00Z"}]
    assert merge(current, [WINDOW], {("dualsched.io/inference-window", "NoExecute")}, NOON) == current


# ------------------------------------------------------------------ the patch and its bookkeeping


def test_a_node_as_wanted_is_not_patched():
    assert patch_for(node([*FOREIGN, SLURM], "dualsched.io/slurm:NoSchedule"), taints_only([SLURM]), NOON) is None
    assert patch_for(node(FOREIGN), taints_only([]), NOON) is None


def test_the_patch_records_what_it_owns_and_is_conditional_on_the_version_read():
    patch = patch_for(node(FOREIGN, version="42"), taints_only([WINDOW, SLURM]), NOON)
    assert patch["metadata"] == {"resourceVersion": "42",
                                 "annotations": {OWNED_ANNOTATION: "dualsched.io/inference-window:NoExecute,dualsched.io/slurm:NoSchedule"}}  # fmt: skip
    assert patch["spec"]["taints"][: len(FOREIGN)] == FOREIGN
    assert owned(patch["metadata"]["annotations"]) == {("dualsched.io/slurm", "NoSchedule"), ("dualsched.io/inference-window", "NoExecute")}


def test_a_taint_already_there_is_adopted_without_touching_the_list():
    """A taint it wants but did not set (a kubectl taint, or the NodePatch of earlier versions)."""
    patch = patch_for(node([FOREIGN[0], SLURM]), taints_only([SLURM]), NOON)
    assert patch == {"metadata": {"resourceVersion": "7", "annotations": {OWNED_ANNOTATION: "dualsched.io/slurm:NoSchedule"}}}


def test_when_the_window_opens_its_taint_and_its_record_go():
    desired = {"keptBy": KEPT_BY, "pools": [time_shared(9 * 60, 480)]}
    closed = patch_for(node(FOREIGN), wanted_by_node(desired, at("08:59"), {})["gpu-001"], at("08:59"))
    assert closed["spec"]["taints"][-1]["key"] == WINDOW["key"]
    after_closing = node(closed["spec"]["taints"], closed["metadata"]["annotations"][OWNED_ANNOTATION])
    opened = patch_for(after_closing, wanted_by_node(desired, at("09:00"), {})["gpu-001"], at("09:00"))
    assert opened == {"metadata": {"resourceVersion": "7", "annotations": {OWNED_ANNOTATION: None}}, "spec": {"taints": FOREIGN}}


def test_the_last_taint_removed_removes_the_list():
    patch = patch_for(node([SLURM], "dualsched.io/slurm:NoSchedule"), taints_only([]), NOON)
    assert patch["spec"] == {"taints": None} and patch["metadata"]["annotations"] == {OWNED_ANNOTATION: None}


# ------------------------------------------------------------------ labels: only the keys it owns


def test_wanted_labels_are_set_and_nobody_elses_are_named():
    assert label_changes(THEIR_LABELS, POOL_LABELS, set()) == POOL_LABELS
    assert label_changes({**THEIR_LABELS, **POOL_LABELS}, POOL_LABELS, set(POOL_LABELS)) == {}


def test_a_wanted_label_someone_else_changed_is_set_back():
    assert label_changes({**POOL_LABELS, "dualsched.io/slurm-gpus": "2"}, POOL_LABELS, set(POOL_LABELS)) == {"dualsched.io/slurm-gpus": "8"}


def test_only_labels_it_recorded_are_removed_when_no_longer_wanted():
    current = {**THEIR_LABELS, **POOL_LABELS, "dualsched.io/old": "x"}
    wanted = {k: v for k, v in POOL_LABELS.items() if k != "dualsched.io/slurm-gpus"}
    # slurm-gpus and old were its own; the hostname label never was, and a recorded key already gone needs nothing
    owned_keys = {*POOL_LABELS, "dualsched.io/old", "dualsched.io/gone"}
    assert label_changes(current, wanted, owned_keys) == {"dualsched.io/old": None, "dualsched.io/slurm-gpus": None}
    assert label_changes(current, wanted, set(wanted)) == {}


def test_the_patch_sets_labels_and_records_their_keys():
    patch = patch_for(node([], labels=THEIR_LABELS), Wanted(POOL_LABELS, []), NOON)
    assert patch == {"metadata": {"resourceVersion": "7", "labels": POOL_LABELS,
                                  "annotations": {OWNED_LABELS_ANNOTATION: "dualsched.io/mode,dualsched.io/pool,dualsched.io/slurm-gpus"}}}  # fmt: skip
    labelled = node([], labels={**THEIR_LABELS, **POOL_LABELS}, owned_labels=patch["metadata"]["annotations"][OWNED_LABELS_ANNOTATION])
    assert patch_for(labelled, Wanted(POOL_LABELS, []), NOON) is None


def test_a_label_dropped_from_the_config_is_removed_with_its_record():
    labelled = node([], labels={**THEIR_LABELS, **POOL_LABELS}, owned_labels=",".join(sorted(POOL_LABELS)))
    patch = patch_for(labelled, Wanted({"dualsched.io/pool": "h100"}, []), NOON)
    assert patch["metadata"]["labels"] == {"dualsched.io/mode": None, "dualsched.io/slurm-gpus": None}
    assert patch["metadata"]["annotations"] == {OWNED_LABELS_ANNOTATION: "dualsched.io/pool"} and "spec" not in patch


# ------------------------------------------------------------------ passes


class FakeApi:
    """Nodes by name; a node may answer 409 a number of times, as when someone writes it meanwhile. Keepers' Leases
    by namespace."""

    def __init__(self, nodes: dict[str, dict], conflicts: int = 0, refuse: str = "", leases: Optional[dict[str, dict]] = None):
        self.nodes, self.conflicts, self.refuse = nodes, conflicts, refuse
        self.leases = dict(leases or {})
        self.patches: list[tuple[str, dict]] = []

    def lease(self, namespace: str) -> Optional[dict]:
        return json.loads(json.dumps(self.leases[namespace])) if namespace in self.leases else None

    def renew_lease(self, namespace: str, now: datetime) -> None:
        self.leases[namespace] = {"spec": {"holderIdentity": namespace, "leaseDurationSeconds": LEASE_SECONDS, **renewal(now)["spec"]}}

    def node(self, name: str) -> Optional[dict]:
        if name == self.refuse:
            raise urllib.error.HTTPError(f"/api/v1/nodes/{name}", 403, "Forbidden", None, None)
        return json.loads(json.dumps(self.nodes[name])) if name in self.nodes else None

    def node_names(self, selector: str) -> list[str]:
        key, value = selector.split("=")
        return [name for name, found in self.nodes.items() if found["metadata"]["labels"].get(key) == value]

    def patch_node(self, name: str, patch: dict) -> bool:
        if self.conflicts:
            self.conflicts -= 1
            return False
        self.patches.append((name, patch))
        current = self.nodes[name]
        for field in ("annotations", "labels"):  # a merge patch: None removes the key
            for key, value in (patch["metadata"].get(field) or {}).items():
                current["metadata"][field].pop(key, None) if value is None else current["metadata"][field].update({key: value})
        if "spec" in patch:
            current["spec"]["taints"] = patch["spec"]["taints"] or []
        return True


def _keeper(api: FakeApi) -> tuple[Keeper, list[str]]:
    lines: list[str] = []
    return Keeper(api, lines.append), lines


def test_a_pass_logs_one_line_per_change_and_then_has_nothing_to_do():
    api = FakeApi({"gpu-001": node([FOREIGN[0], {**SLURM, "value": "old"}], "dualsched.io/slurm:NoSchedule")})
    keeper, lines = _keeper(api)
    desired = {"keptBy": KEPT_BY, "pools": [time_shared(9 * 60, 480, taints=[SLURM])]}
    assert keeper.run_pass(desired, at("20:00"))
    assert lines == ["gpu-001: removed dualsched.io/slurm=old:NoSchedule", "gpu-001: added dualsched.io/slurm=true:NoSchedule",
                     "gpu-001: added dualsched.io/inference-window=closed:NoExecute"]  # fmt: skip
    assert keeper.run_pass(desired, at("20:00")) and len(api.patches) == 1 and len(lines) == 3


def test_a_pass_sets_labels_and_taints_in_one_patch_and_logs_each():
    api = FakeApi({"gpu-001": node([FOREIGN[0]], labels=THEIR_LABELS)})
    keeper, lines = _keeper(api)
    desired = {"keptBy": KEPT_BY, "pools": [{"name": "p", "nodes": ["gpu-001"], "labels": POOL_LABELS, "taints": [SLURM], "window": None}]}
    assert keeper.run_pass(desired, NOON) and keeper.run_pass(desired, NOON) and len(api.patches) == 1
    assert api.nodes["gpu-001"]["metadata"]["labels"] == {**THEIR_LABELS, **POOL_LABELS}
    assert lines == [*(f"gpu-001: label {k}={v} set" for k, v in POOL_LABELS.items()), "gpu-001: added dualsched.io/slurm=true:NoSchedule"]
    desired["pools"][0]["labels"] = {"dualsched.io/pool": "p"}
    assert keeper.run_pass(desired, NOON)
    assert api.nodes["gpu-001"]["metadata"]["labels"] == {**THEIR_LABELS, "dualsched.io/pool": "p"}
    assert lines[-3:] == ["gpu-001: label dualsched.io/pool=p set", "gpu-001: label dualsched.io/mode removed", "gpu-001: label dualsched.io/slurm-gpus removed"]


def kept(pool_name: str, by: str = "slurm") -> dict[str, Any]:
    """A node the keeper of namespace ``by`` put into pool ``pool_name``, beside a foreign label and taint."""
    labels = {**THEIR_LABELS, **POOL_LABELS, "dualsched.io/pool": pool_name, KEPT_BY_LABEL: by}
    recorded = ",".join(sorted({*POOL_LABELS, KEPT_BY_LABEL}))
    return node([FOREIGN[0], SLURM], "dualsched.io/slurm:NoSchedule", labels=labels, owned_labels=recorded)


def test_a_node_that_left_every_pool_loses_what_the_keeper_recorded_there_and_nothing_else():
    api = FakeApi({"gpu-001": kept("h100"), "gpu-002": kept("h100")})
    keeper, lines = _keeper(api)
    pool = {"name": "h100", "nodes": ["gpu-002"], "labels": {**POOL_LABELS, KEPT_BY_LABEL: "slurm"}, "taints": [SLURM], "window": None}
    desired = {"keptBy": KEPT_BY, "pools": [pool]}
    assert keeper.run_pass(desired, NOON) and keeper.run_pass(desired, NOON)
    released = api.nodes["gpu-001"]
    assert released["metadata"]["labels"] == THEIR_LABELS and released["spec"]["taints"] == [FOREIGN[0]]
    assert released["metadata"]["annotations"] == {}  # its records go too: the node is nobody's
    assert lines[0] == "gpu-001: in no pool any more: released" and len(lines) == 1 + len(POOL_LABELS) + 2  # labels, taint
    assert [name for name, _ in api.patches] == ["gpu-001"]  # once; gpu-002 was as wanted


def joining_pool(bound: list[str]) -> dict[str, Any]:
    """Pool h100 whose nodes join by label: a node of ``bound`` labelled dualsched.io/pool=h100 is a member."""
    return {"name": "h100", "nodes": bound, "labels": {**POOL_LABELS, KEPT_BY_LABEL: "slurm"}, "taints": [SLURM], "window": None,
            "joinSelector": "dualsched.io/pool=h100"}  # fmt: skip


def labelled(name: str, labels: dict[str, str]) -> dict[str, Any]:
    found = node([], labels={**THEIR_LABELS, **labels})
    found["metadata"]["name"] = name
    return found


def test_a_node_of_the_bound_labelled_into_a_joining_pool_gets_its_labels_and_taints():
    """An autoscaler's node template (or `kubectl label`) set the pool label: the node joins. One outside the bound,
    or without the label, is not touched."""
    api = FakeApi({
        "gpu-001": labelled("gpu-001", {"dualsched.io/pool": "h100"}),
        "gpu-002": labelled("gpu-002", {}),
        "gpu-009": labelled("gpu-009", {"dualsched.io/pool": "h100"}),  # outside the bound
    })  # fmt: skip
    keeper, lines = _keeper(api)
    desired = {"keptBy": KEPT_BY, "pools": [joining_pool(["gpu-001", "gpu-002", "gpu-003"])]}
    assert keeper.run_pass(desired, NOON) and keeper.run_pass(desired, NOON)
    assert api.nodes["gpu-001"]["metadata"]["labels"] == {**THEIR_LABELS, **POOL_LABELS, KEPT_BY_LABEL: "slurm"}
    assert api.nodes["gpu-001"]["spec"]["taints"] == [SLURM]
    assert [name for name, _ in api.patches] == ["gpu-001"]  # once; gpu-003 is not logged as missing
    assert not any("gpu-003" in line for line in lines)


def test_a_node_whose_label_is_removed_leaves_the_joining_pool_and_is_released():
    api = FakeApi({"gpu-001": kept("h100"), "gpu-002": kept("h100")})
    api.nodes["gpu-001"]["metadata"]["labels"].pop("dualsched.io/pool")  # `kubectl label node gpu-001 dualsched.io/pool-`
    keeper, lines = _keeper(api)
    assert keeper.run_pass({"keptBy": KEPT_BY, "pools": [joining_pool(["gpu-001", "gpu-002"])]}, NOON)
    assert api.nodes["gpu-001"]["metadata"]["labels"] == THEIR_LABELS and api.nodes["gpu-001"]["spec"]["taints"] == [FOREIGN[0]]
    assert lines[0] == "gpu-001: in no pool any more: released"
    assert [name for name, _ in api.patches] == ["gpu-001"]


def test_without_the_list_of_labelled_nodes_nothing_is_released():
    """A joined node would look released and lose its slurmd pod: the pass changes nothing and is not complete."""

    class NoLabelList(FakeApi):
        def node_names(self, selector):
            if selector.startswith("dualsched.io/pool="):
                raise urllib.error.HTTPError("/api/v1/nodes", 500, "Internal Server Error", None, None)
            return super().node_names(selector)

    api = NoLabelList({"gpu-001": kept("h100")})
    keeper, lines = _keeper(api)
    assert not keeper.run_pass({"keptBy": KEPT_BY, "pools": [joining_pool(["gpu-001"])]}, NOON)
    assert api.patches == [] and lines == ["the nodes labelled into pools: the API server refused: 500 Internal Server Error"]


def test_a_node_another_stacks_keeper_keeps_is_never_released():
    api = FakeApi({"gpu-001": kept("h100", by="team-b")})
    keeper, lines = _keeper(api)
    assert keeper.run_pass({"keptBy": KEPT_BY, "pools": []}, NOON)
    assert api.patches == [] and lines == []


def test_each_pass_renews_the_keepers_own_lease():
    api = FakeApi({})
    keeper, _ = _keeper(api)
    assert keeper.run_pass({"keptBy": KEPT_BY, "pools": []}, NOON)
    assert set(api.leases) == {"slurm"} and api.leases["slurm"]["spec"]["renewTime"] == "2025-06-01T12:00:00.000000Z"


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _pool_naming_a_node_team_b_keeps() -> tuple[FakeApi, dict]:
    """gpu-001, kept by the keeper of namespace team-b (its Lease renewed at noon), and this keeper's pool that
    names it too: two stacks' hostlists overlap."""
    api = FakeApi({"gpu-001": kept("h100", by="team-b")}, leases={})
    api.renew_lease("team-b", NOON)
    pool = {"name": "a100", "nodes": ["gpu-001"], "labels": {"dualsched.io/pool": "a100", KEPT_BY_LABEL: "slurm"}, "taints": [], "window": None}
    return api, {"keptBy": KEPT_BY, "pools": [pool]}


def test_a_node_another_keeper_keeps_while_it_renews_its_lease_is_left_alone_and_the_keeper_is_not_ready():
    """Two stacks' pools naming one node no longer relabel it in turn (each turn replaced its slurmd pod, killing its
    jobs): the stack that came second stays unready, so its `pulumi up` fails, and the node stays the first's."""
    api, desired = _pool_naming_a_node_team_b_keeps()
    clock = Clock()
    lines: list[str] = []
    keeper = Keeper(api, lines.append, clock)
    for minute in range(1, 30):
        clock.now += 60
        api.renew_lease("team-b", NOON + timedelta(minutes=minute))  # the other keeper renews
        assert not keeper.run_pass(desired, NOON)
    assert [name for name, _ in api.patches] == [] and api.nodes["gpu-001"]["metadata"]["labels"][KEPT_BY_LABEL] == "team-b"
    assert lines == ["gpu-001: kept by the node keeper of namespace team-b, whose Lease is renewed: left alone "
                     "(two stacks' pools name it; take it out of one, or destroy that stack)"]  # once


def test_a_node_whose_keeper_stopped_renewing_is_taken_over_once_its_lease_expires_on_this_keepers_clock():
    api, desired = _pool_naming_a_node_team_b_keeps()
    clock = Clock()
    lines: list[str] = []
    keeper = Keeper(api, lines.append, clock)
    assert not keeper.run_pass(desired, NOON)  # first seen now: its renewTime is not compared with this clock
    clock.now = LEASE_SECONDS - 1
    assert not keeper.run_pass(desired, NOON) and api.patches == []
    clock.now = LEASE_SECONDS + 1
    assert keeper.run_pass(desired, NOON)
    labels = api.nodes["gpu-001"]["metadata"]["labels"]
    assert labels[KEPT_BY_LABEL] == "slurm" and labels["dualsched.io/pool"] == "a100"
    assert lines[1] == f"gpu-001: taken over from the node keeper of namespace team-b, which has not renewed its Lease for {LEASE_SECONDS}s or has none"


def test_a_node_whose_keeper_has_no_lease_is_taken_over_at_once():
    """Its stack was destroyed (the Lease went with its namespace) without releasing the node."""
    api, desired = _pool_naming_a_node_team_b_keeps()
    del api.leases["team-b"]
    keeper, _ = _keeper(api)
    assert keeper.run_pass(desired, NOON) and api.nodes["gpu-001"]["metadata"]["labels"][KEPT_BY_LABEL] == "slurm"


def test_a_refused_lease_renewal_is_logged_and_leaves_the_pass_incomplete():
    class NoLease(FakeApi):
        def renew_lease(self, namespace, now):
            raise urllib.error.HTTPError(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}", 404, "Not Found", None, None)

    api = NoLease({"gpu-001": node([])})
    keeper, lines = _keeper(api)
    desired = {"keptBy": KEPT_BY, "pools": [{"name": "p", "nodes": ["gpu-001"], "labels": {}, "taints": [SLURM], "window": None}]}
    assert not keeper.run_pass(desired, NOON)
    assert lines[0] == "its Lease: the API server refused: 404 Not Found" and api.nodes["gpu-001"]["spec"]["taints"] == [SLURM]


def test_a_refused_list_of_kept_nodes_still_keeps_the_pool_nodes_and_the_pass_is_incomplete():
    class NoList(FakeApi):
        def node_names(self, selector):
            raise urllib.error.HTTPError("/api/v1/nodes", 403, "Forbidden", None, None)

    api = NoList({"gpu-001": node([])})
    keeper, lines = _keeper(api)
    desired = {"keptBy": KEPT_BY, "pools": [{"name": "p", "nodes": ["gpu-001"], "labels": {}, "taints": [SLURM], "window": None}]}
    assert not keeper.run_pass(desired, NOON)
    assert lines[0] == "the list of kept nodes: the API server refused: 403 Forbidden" and api.nodes["gpu-001"]["spec"]["taints"] == [SLURM]


def test_a_missing_node_is_logged_once_and_does_not_stop_readiness():
    keeper, lines = _keeper(FakeApi({"gpu-002": node([])}))
    desired = {"keptBy": KEPT_BY, "pools": [{"name": "p", "nodes": ["gpu-001", "gpu-002"], "labels": {}, "taints": [SLURM], "window": None}]}
    assert keeper.run_pass(desired, NOON) and keeper.run_pass(desired, NOON)
    assert lines == ["gpu-001: no such node (yet); its labels and taints are set once it joins", "gpu-002: added dualsched.io/slurm=true:NoSchedule"]


def test_a_conflict_leaves_the_pass_incomplete_and_the_next_pass_retries():
    api = FakeApi({"gpu-001": node([])}, conflicts=1)
    keeper, lines = _keeper(api)
    desired = {"keptBy": KEPT_BY, "pools": [{"name": "p", "nodes": ["gpu-001"], "labels": {}, "taints": [SLURM], "window": None}]}
    assert not keeper.run_pass(desired, NOON)
    assert lines == ["gpu-001: changed by someone else meanwhile, trying again on the next pass"]
    assert keeper.run_pass(desired, NOON) and api.nodes["gpu-001"]["spec"]["taints"] == [SLURM]


def test_a_refused_node_is_logged_and_the_pass_goes_on():
    api = FakeApi({"gpu-001": node([]), "gpu-002": node([])}, refuse="gpu-001")
    keeper, lines = _keeper(api)
    desired = {"keptBy": KEPT_BY, "pools": [{"name": "p", "nodes": ["gpu-001", "gpu-002"], "labels": {}, "taints": [SLURM], "window": None}]}
    assert not keeper.run_pass(desired, NOON)
    assert lines[0] == "gpu-001: the API server refused: 403 Forbidden" and [name for name, _ in api.patches] == ["gpu-002"]


def test_without_an_answer_from_the_api_server_the_pass_stops():
    class Down(FakeApi):
        def node(self, name):
            raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))

    keeper, lines = _keeper(Down({}))
    desired = {"keptBy": KEPT_BY, "pools": [{"name": "p", "nodes": ["gpu-001", "gpu-002"], "labels": {}, "taints": [SLURM], "window": None}]}
    assert not keeper.run_pass(desired, NOON)
    assert len(lines) == 1 and lines[0].startswith("gpu-001: no answer from the API server")


def test_ready_only_while_the_last_pass_was_complete():
    keeper, _ = _keeper(FakeApi({}))
    server = serve_health(0, keeper)
    url = f"http://127.0.0.1:{server.server_address[1]}"

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(url + path, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    try:
        assert (status("/healthz"), status("/readyz"), status("/other")) == (200, 503, 404)
        keeper.ready = True
        assert status("/readyz") == 200
    finally:
        server.shutdown()


# ------------------------------------------------------------------ the API server calls


class FakeApiServer(BaseHTTPRequestHandler):
    """Answers GET and PATCH of nodes as the API server does; records what it was sent."""

    requests: list[tuple[str, str, dict, Any]] = []
    answers: dict[str, int] = {}
    listing: dict[str, Any] = {"items": []}

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        FakeApiServer.requests.append((self.command, self.path, dict(self.headers), json.loads(body) if body else None))
        status = FakeApiServer.answers.get(f"{self.command} {self.path.split('?')[0]}", 200)
        found = FakeApiServer.listing if "labelSelector=" in self.path else node([])
        payload = json.dumps(found if status == 200 else {"kind": "Status", "code": status}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_PATCH = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def api(tmp_path):
    FakeApiServer.requests, FakeApiServer.answers = [], {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "token").write_text("keeper-token\n")
    yield ApiServer(f"http://127.0.0.1:{server.server_address[1]}", str(tmp_path / "token"), None)
    server.shutdown()


def test_the_keeper_gets_and_merge_patches_one_node_with_its_own_token(api):
    assert api.node("gpu-001")["metadata"]["resourceVersion"] == "7"
    assert api.patch_node("gpu-001", {"metadata": {"resourceVersion": "7"}})
    (get_method, get_path, get_headers, _), (method, path, headers, body) = FakeApiServer.requests
    assert (get_method, get_path, get_headers["Authorization"]) == ("GET", "/api/v1/nodes/gpu-001", "Bearer keeper-token")
    assert (method, path) == ("PATCH", f"/api/v1/nodes/gpu-001?fieldManager={FIELD_MANAGER}")
    assert headers["Content-Type"] == "application/merge-patch+json" and body == {"metadata": {"resourceVersion": "7"}}


def test_the_kept_nodes_are_listed_by_their_label(api):
    FakeApiServer.listing = {"items": [node([])]}
    assert api.node_names(KEPT_BY) == ["gpu-001"]
    [(method, path, headers, _)] = FakeApiServer.requests
    assert (method, path, headers["Authorization"]) == ("GET", "/api/v1/nodes?labelSelector=dualsched.io%2Fkept-by%3Dslurm", "Bearer keeper-token")


def test_the_keeper_renews_its_own_lease_and_reads_anothers(api):
    FakeApiServer.answers = {f"GET /apis/coordination.k8s.io/v1/namespaces/gone/leases/{LEASE}": 404}
    api.renew_lease("slurm", NOON)
    assert api.lease("team-b") is not None and api.lease("gone") is None
    (method, path, headers, body), (get_method, get_path, _, _), _ = FakeApiServer.requests
    assert (method, path) == ("PATCH", f"/apis/coordination.k8s.io/v1/namespaces/slurm/leases/{LEASE}?fieldManager={FIELD_MANAGER}")
    assert headers["Content-Type"] == "application/merge-patch+json" and body == renewal(NOON)
    assert (get_method, get_path) == ("GET", f"/apis/coordination.k8s.io/v1/namespaces/team-b/leases/{LEASE}")


def test_a_missing_node_is_none_a_conflict_is_false_and_other_refusals_raise(api):
    FakeApiServer.answers = {"GET /api/v1/nodes/gone": 404, "PATCH /api/v1/nodes/busy": 409, "GET /api/v1/nodes/secret": 403}
    assert api.node("gone") is None
    assert api.patch_node("busy", {}) is False
    with pytest.raises(urllib.error.HTTPError):
        api.node("secret")


# ------------------------------------------------------------------ the deployed parts


def _keeper_objects(rendered):
    [files] = [c for c in rendered.by_kind("ConfigMap") if c.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "node-keeper"]
    [deployment] = [d for d in rendered.by_kind("Deployment") if d.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "node-keeper"]
    return files, deployment


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_desired_state_is_every_pools_nodes_and_taints(stack):
    rendered = render_stack(stack)
    files, _ = _keeper_objects(rendered)
    state = json.loads(files.manifest["data"][STATE_FILE])
    assert state == desired_state(rendered.config)
    assert [pool["name"] for pool in state["pools"]] == [pool.name for pool in rendered.config.pools]
    assert sum(len(pool["nodes"]) for pool in state["pools"]) == (2 if stack == "dev" else 80)
    assert files.namespace == "slurm" and files.manifest["data"][PROGRAM_FILE] == source(PROGRAM_FILE)


def test_a_joining_pools_bound_is_in_the_desired_state_with_its_label_and_in_the_keepers_role_by_name():
    """The bound's names may be patched (the admission policy asks for KEEP_VERB by name): a kubelet names its own
    Node after its credential, so no node outside the bound joins whatever labels it gives itself."""
    rendered = render_raw(with_joining_pool(raw_stack("dev"), nodes="burst-[001-003]"))
    state = json.loads(_keeper_objects(rendered)[0].manifest["data"][STATE_FILE])
    [burst] = [pool for pool in state["pools"] if pool["name"] == "burst"]
    assert burst["nodes"] == ["burst-001", "burst-002", "burst-003"] and burst["joinSelector"] == "dualsched.io/pool=burst"
    assert "joinSelector" not in state["pools"][0]
    [role] = [r for r in rendered.by_kind("ClusterRole") if "node-keeper" in r.name]
    [by_name] = [rule for rule in role.manifest["rules"] if KEEP_VERB in rule["verbs"]]
    assert {"burst-001", "burst-002", "burst-003"} <= set(by_name["resourceNames"])


def test_dev_wants_no_taint_and_prod_the_slurm_taint_on_its_dedicated_pools():
    [dev] = json.loads(_keeper_objects(render_stack("dev"))[0].manifest["data"][STATE_FILE])["pools"]
    assert dev == {"name": "gpu", "nodes": ["gpu-001", "gpu-002"], "taints": [], "window": None,
                   "labels": {"dualsched.io/pool": "gpu", "node-restriction.kubernetes.io/dualsched-pool": "gpu",
                              "dualsched.io/mode": "partitioned", "dualsched.io/slurm-gpus": "6", KEPT_BY_LABEL: "slurm"}}  # fmt: skip
    prod = {pool["name"]: pool for pool in json.loads(_keeper_objects(render_stack("prod"))[0].manifest["data"][STATE_FILE])["pools"]}
    assert prod["h100-a"]["taints"] == prod["h100-b"]["taints"] == [SLURM]
    assert prod["h100-a"]["nodes"][0] == "gpu-a-001" and len(prod["h100-a"]["nodes"]) == 32
    assert prod["h100-shared"]["taints"] == [] and prod["h100-shared"]["window"] is None


def test_custom_taints_replace_the_default():
    def taint(raw):
        raw["pools"][0]["taints"] = [{"key": "example.com/reserved", "value": "ml", "effect": "PreferNoSchedule"}]
        raw["inference"]["tolerations"] = [{"key": "example.com/reserved"}]

    files, deployment = _keeper_objects(render_raw(variant("dev", taint)))
    [pool] = json.loads(files.manifest["data"][STATE_FILE])["pools"]
    assert pool["taints"] == [{"key": "example.com/reserved", "value": "ml", "effect": "PreferNoSchedule"}]
    # it tolerates what it sets: its own taints never keep it off (or evict it from) a node
    assert pod_spec(deployment)["tolerations"] == [
        {"key": "example.com/reserved", "operator": "Equal", "value": "ml", "effect": "PreferNoSchedule"}
    ]


def _time_shared(raw):
    raw["pools"][0].update(mode="time-shared", inferenceWindow={"start": "22:00", "durationMinutes": 600})
    raw["pools"][0].pop("slurmGpus", None)
    raw["pools"].append({"name": "serve", "nodes": "inf-[01-02]", "mode": "kubernetes", "gpusPerNode": 4,
                         "allocatable": {"cpus": 64, "memoryMb": 256000}})  # fmt: skip


def test_a_time_shared_pool_gets_its_window_and_the_window_taint_while_closed():
    files, deployment = _keeper_objects(render_raw(variant("dev", _time_shared)))
    state = json.loads(files.manifest["data"][STATE_FILE])
    assert state["pools"][0]["window"] == {"startMinute": 22 * 60, "durationMinutes": 600, "taint": WINDOW}
    assert state["pools"][1]["window"] is None
    # what the program makes of it: the window taint between 08:00 and 22:00 UTC only
    assert wanted_by_node(state, at("21:59"), {})["gpu-001"].taints == [WINDOW] and wanted_by_node(state, at("03:00"), {})["gpu-001"].taints == []
    assert wanted_by_node(state, at("21:59"), {})["inf-01"].taints == []
    assert {"key": WINDOW["key"], "operator": "Equal", "value": "closed", "effect": "NoExecute"} in pod_spec(deployment)["tolerations"]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_keeper_patches_any_node_but_keeps_only_the_pool_nodes_by_name_and_reads_other_keepers_leases(stack):
    rendered = render_stack(stack)
    [role] = [r for r in rendered.by_kind("ClusterRole") if r.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "node-keeper"]
    nodes = sorted(name for pool in rendered.config.pools for name in pool.node_names)
    assert role.manifest["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": [""], "resources": ["nodes"], "resourceNames": nodes, "verbs": [KEEP_VERB]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [LEASE], "verbs": ["get"]},
    ]
    [binding] = [b for b in rendered.by_kind("ClusterRoleBinding") if b.manifest["roleRef"]["name"] == role.name]
    [account] = [a for a in rendered.in_namespace("slurm", "ServiceAccount") if "node-keeper" in a.name]
    assert binding.manifest["subjects"] == [{"kind": "ServiceAccount", "name": account.name, "namespace": "slurm"}]
    assert pod_spec(_keeper_objects(rendered)[1])["serviceAccountName"] == account.name


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_keeper_renews_its_own_lease_in_its_namespace_and_no_other(stack):
    rendered = render_stack(stack)
    [lease] = rendered.by_kind("Lease")
    assert lease.manifest["metadata"]["name"] == LEASE and lease.manifest["metadata"]["namespace"] == "slurm"
    assert lease.manifest["spec"] == {"holderIdentity": "slurm", "leaseDurationSeconds": LEASE_SECONDS}
    [role] = [r for r in rendered.in_namespace("slurm", "Role") if r.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "node-keeper"]
    assert role.manifest["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [LEASE], "verbs": ["patch"]}]
    [binding] = [b for b in rendered.in_namespace("slurm", "RoleBinding") if b.manifest["roleRef"]["name"] == role.name]
    [account] = [a for a in rendered.in_namespace("slurm", "ServiceAccount") if "node-keeper" in a.name]
    assert binding.manifest["subjects"] == [{"kind": "ServiceAccount", "name": account.name, "namespace": "slurm"}]
    keeper = rendered.registration(_keeper_objects(rendered)[1])
    assert {rendered.registration(lease).urn, rendered.registration(binding).urn} <= set(keeper.dependencies)  # renewed from its first pass


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_on_a_node_it_may_not_keep_an_admission_policy_lets_the_keeper_only_release(stack):
    """What the policy allows and refuses is run on a real API server (tests/e2e/test_engine.py); here, that it
    binds the keeper's account, on the nodes its role does not name, denying."""
    rendered = render_stack(stack)
    [policy] = rendered.by_kind("ValidatingAdmissionPolicy")
    [binding] = rendered.by_kind("ValidatingAdmissionPolicyBinding")
    [account] = [a for a in rendered.in_namespace("slurm", "ServiceAccount") if "node-keeper" in a.name]
    spec = policy.manifest["spec"]
    assert spec["failurePolicy"] == "Fail" and policy.namespace is None
    assert spec["matchConstraints"]["resourceRules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}]
    assert [c["expression"] for c in spec["matchConditions"]] == [
        f"request.userInfo.username == 'system:serviceaccount:slurm:{account.name}'",
        f"!authorizer.group('').resource('nodes').name(object.metadata.name).check('{KEEP_VERB}').allowed()",
    ]
    assert [v["expression"] for v in spec["validations"]] == [e for e, _ in RELEASE_ONLY]
    assert binding.manifest["spec"] == {"policyName": policy.name, "validationActions": ["Deny"]}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_one_locked_down_keeper_that_rolls_with_its_desired_state(stack):
    rendered = render_stack(stack)
    files, deployment = _keeper_objects(rendered)
    spec, keeper = pod_spec(deployment), container(deployment, "keeper")
    assert deployment.namespace == "slurm" and deployment.manifest["spec"]["replicas"] == 1
    # never two keepers at once, and a rollout the engine waits for (tests/node/test_node_taints.py)
    assert deployment.manifest["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    # the ConfigMap by its (auto-)name: a new desired state is a new ConfigMap and a new pod
    assert spec["volumes"] == [{"name": "files", "configMap": {"name": files.name}}]
    assert keeper["volumeMounts"] == [{"name": "files", "mountPath": KEEPER_DIR, "readOnly": True}]
    assert keeper["command"] == ["python3", f"{KEEPER_DIR}/{PROGRAM_FILE}"] and keeper["image"] == rendered.config.images.python
    assert spec["automountServiceAccountToken"] is True
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534,
                                       "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    assert keeper["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True, "runAsUser": 65534,
        "runAsGroup": 65534, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert keeper["resources"] == {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}
    assert keeper["readinessProbe"]["httpGet"]["path"] == "/readyz" and keeper["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "hostNetwork" not in spec and "privileged" not in keeper["securityContext"]
