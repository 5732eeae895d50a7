"""Helpers of the real-node tier (see conftest.py): its world, its stack config, its shared directory."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

# The node tier drives the engine exactly as the e2e tier does: share its helpers.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from e2e_support import TOOLS, World, raw_config  # noqa: E402

JOB_USER_UID = 2001
"""alice, the local stack's job user: owns the job and model directories on the shared file system."""


class NodeWorld(World):
    shared: Path

    def node(self, *args: str, check: bool = True):
        return self.run([str(TOOLS / "node.sh"), *args], check=check, timeout=900)


def shared_directory() -> Path:
    """The hostPath "shared file system": world-traversable (job users and the model server read it)."""
    path = Path(tempfile.mkdtemp(prefix="dualsched-shared-", dir="/var/tmp"))
    path.chmod(0o755)
    for sub in ("jobs", "models/tiny"):
        (path / sub).mkdir(parents=True)
    # the model inference serves before any training run (as a model already on the NFS would be)
    (path / "models/tiny/config.json").write_text('{"model_type": "stand-in", "version": 0}\n')
    for sub in ("jobs", "models", "models/tiny", "models/tiny/config.json"):
        os.chown(path / sub, JOB_USER_UID, JOB_USER_UID)
    return path


def local_config(world: NodeWorld) -> dict:
    """The checkout's local stack, its shared directory in this session's temp dir."""
    config = raw_config("local")
    config["storage"]["hostPath"]["path"] = str(world.shared)
    return config
