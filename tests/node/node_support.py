"""Helpers of the real-node tier (see conftest.py): its world, its stack config, its shared directory."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

# The node tier drives the engine exactly as the e2e tier does: share its helpers; and it prepares
# its shared directory with the tool `make up` uses.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from config.loader import parse_stack_config  # noqa: E402
from e2e_support import TOOLS, World, raw_config  # noqa: E402
from seed_shared import seed_shared  # noqa: E402

JOB_USER_UID = 2001
"""alice, the local stack's job user: owns the job and model directories on the shared file system."""


class NodeWorld(World):
    shared: Path

    def node(self, *args: str, check: bool = True):
        return self.run([str(TOOLS / "node.sh"), *args], check=check, timeout=900)


def shared_directory() -> Path:
    """The hostPath "shared file system" of this session, prepared as `make up` prepares the local stack's."""
    path = Path(tempfile.mkdtemp(prefix="dualsched-shared-", dir="/var/tmp"))
    seed_shared(parse_stack_config(with_shared_path(raw_config("local"), path), "Pulumi.local.yaml"))
    return path


def with_shared_path(config: dict, path: Path) -> dict:
    config["storage"]["hostPath"]["path"] = str(path)
    return config


def local_config(world: NodeWorld) -> dict:
    """The checkout's local stack, its shared directory in this session's temp dir and its API server's
    port (a free one, not 6443) open to the token minter."""
    config = with_shared_path(raw_config("local"), world.shared)
    config["network"]["apiServerPorts"] = [int(world.env["DUALSCHED_APISERVER_PORT"])]
    return config
