"""Which Slurm nodes' Kubernetes nodes are cordoned: a sidecar of slurmctld's pod (docs/health.md).

Every round it reads each pool node (GET by name: its ClusterRole names exactly these nodes) and
writes the names of those with ``spec.unschedulable`` to a file, one a line, replaced atomically.
cordon_drain.sh, in the reconfigure sidecar beside it, has scontrol and acts on that file: it
drains those nodes and resumes the ones it drained once they are off the list. A round that fails
to read any node writes nothing, so a flaky API server never resumes a cordoned node.
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
from typing import Callable, Iterable, Optional

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


def cordoned(nodes: Iterable[str], get_node: GetNode) -> list[str]:
    """The nodes whose Node is unschedulable; an error reading any of them propagates."""
    found = []
    for name in nodes:
        node = get_node(name)
        if node is not None and node.get("spec", {}).get("unschedulable"):
            found.append(name)
    return found


def write_atomically(path: str, names: list[str]) -> None:
    """The reader never sees half a list: write beside the file, then rename over it."""
    partial = f"{path}.partial"
    with open(partial, "w") as out:
        out.write("".join(f"{name}\n" for name in names))
    os.replace(partial, path)


def run_round(nodes: list[str], get_node: GetNode, out_file: str, log: Callable[[str], None]) -> bool:
    try:
        names = cordoned(nodes, get_node)
    except (urllib.error.URLError, OSError, ValueError) as error:
        log(f"cordon watch: could not read the pool nodes, the list stays as it was: {error}")
        return False
    write_atomically(out_file, names)
    return True


def log_line(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def stop(signum: int, frame: object) -> None:
    """The kubelet's SIGTERM: as PID 1 the program would otherwise ignore it until the SIGKILL."""
    raise SystemExit(0)


def main() -> None:
    signal.signal(signal.SIGTERM, stop)
    env = os.environ
    with open(env["WATCH_NODES_FILE"]) as listed:
        nodes = listed.read().split()
    host = env["KUBERNETES_SERVICE_HOST"]
    url = f"https://{f'[{host}]' if ':' in host else host}:{env['KUBERNETES_SERVICE_PORT']}"
    api = ApiServer(url, f"{SERVICE_ACCOUNT_DIR}/token", f"{SERVICE_ACCOUNT_DIR}/ca.crt")
    log_line(f"cordon watch: {len(nodes)} pool nodes, a round every {ROUND_SECONDS}s")
    while True:
        run_round(nodes, api.node, env["WATCH_OUT_FILE"], log_line)
        time.sleep(ROUND_SECONDS)


if __name__ == "__main__":
    main()
