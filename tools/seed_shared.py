"""Prepare a hostPath "shared file system" the way a file server would hold it.

`storage.type: hostPath` is a directory of the one real node: it gets a jobs directory and the
model directories, owned by the stack's first job user, and each model a first version for the
server to load before any training ran (a model already on the NFS, elsewhere). Used by
`tools/up.sh` and the real-node tier; a stack with other storage is left alone.

Usage: python tools/seed_shared.py Pulumi.<stack>.yaml
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dualsched.config import load_stack_file  # noqa: E402
from dualsched.config.models import StackConfig, StorageType  # noqa: E402

FIRST_VERSION = '{"model_type": "stand-in", "version": 0}\n'


def seed_shared(config: StackConfig) -> None:
    base = Path(config.storage.host_path.path)
    models = base / config.storage.models_path
    owner = config.slurm.users[0] if config.slurm.users else None
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)  # job users and the model server traverse it
    for path in [base / "jobs", models, *(models / model.path for model in config.inference.models)]:
        path.mkdir(parents=True, exist_ok=True)
        if owner:
            os.chown(path, owner.uid, owner.group_id)
    for model in config.inference.models:
        if not any((models / model.path).iterdir()):
            (models / model.path / "config.json").write_text(FIRST_VERSION)


if __name__ == "__main__":
    stack = load_stack_file(sys.argv[1])
    if stack.storage.type is StorageType.HOST_PATH:
        seed_shared(stack)
        print(f"[up] shared directory {stack.storage.host_path.path} ready (jobs/, {stack.storage.models_path}/)")
