"""The node keeper's program, run on the host, for clusters whose nodes run no container (KWOK).

    python -m tools.host_keeper CLUSTER_DIR      # until interrupted (tools/up.sh runs it beside `pulumi up`)

On KWOK nodes the keeper's pod is only marked Ready, so nothing would write the pools' labels and taints,
and neither slurmd nor a model server would find a node. This runs the keeper's own code
(components/programs/node_keeper.py: ``Keeper``, ``ApiServer``) on the host instead, as its pod would:
every ``PERIOD`` seconds, for each node-keeper Deployment in the cluster, one pass over the desired
state of the ConfigMap its pod template mounts, with a token of the keeper's own ServiceAccount (so under
its RBAC and admission policy: it keeps the pool nodes and may only release others). What it does not prove: the pod itself (its image,
probes, NetworkPolicy, SIGTERM); tests/node/test_node_taints.py runs that on a real kubelet.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dualsched.components.node_keeper import KEEPER, STATE_FILE  # noqa: E402
from dualsched.components.programs.node_keeper import ApiServer, Keeper, log_line  # noqa: E402

PERIOD = 2.0


class HostKeeper(threading.Thread):
    """Passes of the keeper for the cluster of ``cluster_dir`` (its kubeconfig and CA), with ``env``'s kubectl."""

    def __init__(self, cluster_dir: Path, env: dict[str, str], log=log_line):
        super().__init__(daemon=True, name="host-keeper")
        self.env = {**env, "KUBECONFIG": str(cluster_dir / "kubeconfig")}
        self.url = re.search(r"server: (\S+)", (cluster_dir / "kubeconfig").read_text()).group(1)
        self.ca_file = str(cluster_dir / "pki" / "ca.crt")
        self.tokens = Path(tempfile.mkdtemp(prefix="host-keeper-"))
        self.log, self.stopped = log, threading.Event()
        self.keepers: dict[str, Keeper] = {}
        """By namespace, as its pod's would: each remembers the other keepers' Leases as it last saw them change."""

    def run(self) -> None:
        while not self.stopped.wait(PERIOD):
            try:
                self.run_pass()
            except Exception as error:  # noqa: BLE001 (logged; the next pass tries again)
                self.log(f"host keeper: pass failed: {error!r}")

    def _kubectl(self, *args: str) -> Optional[str]:
        result = subprocess.run(["kubectl", *args], env=self.env, capture_output=True, text=True, timeout=60)
        return result.stdout if result.returncode == 0 else None

    def run_pass(self) -> None:
        found = self._kubectl("get", "deployments", "-A", "-l", f"app.kubernetes.io/name={KEEPER}", "-o", "json")
        for deployment in json.loads(found)["items"] if found else []:
            namespace = deployment["metadata"]["namespace"]
            pod = deployment["spec"]["template"]["spec"]
            [files] = [volume["configMap"]["name"] for volume in pod["volumes"] if "configMap" in volume]
            config_map = self._kubectl("get", "configmap", files, "-n", namespace, "-o", "json")
            token = self._kubectl("create", "token", pod["serviceAccountName"], "-n", namespace)
            if config_map is None or token is None:
                continue  # being replaced or deleted: the next pass sees what follows
            token_file = self.tokens / namespace
            token_file.write_text(token.strip())
            keeper = self.keepers.setdefault(namespace, Keeper(ApiServer(self.url, str(token_file), self.ca_file), self.log))
            keeper.run_pass(json.loads(json.loads(config_map)["data"][STATE_FILE]), datetime.now(timezone.utc))

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def main(argv: list[str]) -> int:
    keeper = HostKeeper(Path(argv[0]), dict(os.environ))
    keeper.start()
    try:
        keeper.join()
    except KeyboardInterrupt:
        keeper.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
