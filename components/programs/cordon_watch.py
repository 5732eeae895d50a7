"""Which Slurm nodes' Kubernetes nodes are cordoned, and which left a pool they joined by label: a sidecar of
slurmctld's pod (docs/health.md, docs/node-pools.md).

Every round it reads the list of pool nodes afresh from its ConfigMap, then each pool node (GET by name: its
ClusterRole names exactly these nodes), and
writes the names of those with ``spec.unschedulable`` to a file, one a line, replaced atomically.
A node of a pool whose nodes join by label is listed with the labels that make it a member (the node
keeper's: the guarded pool label and the stack's kept-by); one without them, or not in the cluster,
goes to a second file, the nodes that left. cordon_drain.sh, in the reconfigure sidecar beside it,
has scontrol and acts on both: it drains the cordoned nodes and resumes the ones it drained once they
are off the list, and drains a node that left, then deletes it from Slurm once no job runs there. A
round that fails to read any node writes nothing, so a flaky API server never resumes a cordoned
node, nor makes a node look gone.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import sys
import time
import urllib.error
import urllib.request
from typing import Callable, Iterable, Mapping, NamedTuple, Optional

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ROUND_SECONDS = 10
REQUEST_SECONDS = 10

GetNode = Callable[[str], Optional[dict]]


class ApiServer:
    """GET of one Node with the token projected into this container (read each time: it rotates)."""

    def __init__(self, url: str, token_file: str, ca_file: str):
        self.url, self.token_file = url, token_file
        self.context = ssl.create_default_context(cafile=ca_file)

    def node(self, name: str) -> Optional[dict]:
        """The Node, or None when there is none of that name (not joined yet, or deleted)."""
        with open(self.token_file) as token:
            bearer = token.read().strip()
        request = urllib.request.Request(
            f"{self.url}/api/v1/nodes/{name}", headers={"Authorization": f"Bearer {bearer}", "Accept": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=REQUEST_SECONDS) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise


class Watched(NamedTuple):
    """A pool node, and for a node that joins by label the labels it has while it is a member."""

    name: str
    member_labels: Optional[Mapping[str, str]] = None


def parse_watched(text: str) -> list[Watched]:
    """The watch list: a node a line, followed for a joining node by ``key=value,...`` of its member labels."""
    watched = []
    for line in text.splitlines():
        name, _, labels = line.strip().partition(" ")
        if name:
            watched.append(Watched(name, dict(pair.split("=", 1) for pair in labels.split(",")) if labels else None))
    return watched


def member(node: Optional[dict], labels: Mapping[str, str]) -> bool:
    have = ((node or {}).get("metadata") or {}).get("labels") or {}
    return node is not None and all(have.get(key) == value for key, value in labels.items())


def observe(nodes: Iterable[Watched], get_node: GetNode) -> tuple[list[str], list[str]]:
    """The nodes whose Node is unschedulable, and the joining nodes that are not members; an error reading any
    node propagates."""
    cordoned, left = [], []
    for watched in nodes:
        node = get_node(watched.name)
        if node is not None and node.get("spec", {}).get("unschedulable"):
            cordoned.append(watched.name)
        if watched.member_labels is not None and not member(node, watched.member_labels):
            left.append(watched.name)
    return cordoned, left


def write_atomically(path: str, names: list[str]) -> None:
    """The reader never sees half a list: write beside the file, then rename over it."""
    partial = f"{path}.partial"
    with open(partial, "w") as out:
        out.write("".join(f"{name}\n" for name in names))
    os.replace(partial, path)


def run_round(nodes_file: str, get_node: GetNode, out_file: str, left_file: str, log: Callable[[str], None]) -> bool:
    """One round over the watch list as the ConfigMap has it now: the kubelet swaps a changed list in, and a pool change
    that needs no slurmctld restart (Slurm 23.11 and later) restarts no watcher either."""
    try:
        with open(nodes_file) as listed:
            nodes = parse_watched(listed.read())
        cordoned, left = observe(nodes, get_node)
    except (urllib.error.URLError, OSError, ValueError) as error:
        log(f"cordon watch: could not read the pool nodes, the lists stay as they were: {error}")
        return False
    write_atomically(left_file, left)
    write_atomically(out_file, cordoned)
    return True


def log_line(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def stop(signum: int, frame: object) -> None:
    """The kubelet's SIGTERM: as PID 1 the program would otherwise ignore it until the SIGKILL."""
    raise SystemExit(0)


def main() -> None:
    signal.signal(signal.SIGTERM, stop)
    env = os.environ
    host = env["KUBERNETES_SERVICE_HOST"]
    url = f"https://{f'[{host}]' if ':' in host else host}:{env['KUBERNETES_SERVICE_PORT']}"
    api = ApiServer(url, f"{SERVICE_ACCOUNT_DIR}/token", f"{SERVICE_ACCOUNT_DIR}/ca.crt")
    log_line(f"cordon watch: the pool nodes of {env['WATCH_NODES_FILE']}, a round every {ROUND_SECONDS}s")
    while True:
        run_round(env["WATCH_NODES_FILE"], api.node, env["WATCH_OUT_FILE"], env["WATCH_LEFT_FILE"], log_line)
        time.sleep(ROUND_SECONDS)


if __name__ == "__main__":
    main()
