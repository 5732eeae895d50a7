"""Prepare a hostPath "shared file system" the way a file server would hold it.

`storage.type: hostPath` is a directory of the one real node: it gets a jobs directory and the
model directories, owned by the stack's first job user, and each model a first version for the
server to load before any training ran (a model already on the NFS, elsewhere); the container
images named on the command line go to its images directory, where Slurm jobs find them
(`srun --container-image=/shared/images/<name>`). Used by `tools/up.sh` and the real-node tiers; a
stack with other storage is left alone.

Usage: python tools/seed_shared.py Pulumi.<stack>.yaml [NAME=IMAGE_FILE...]
"""

from __future__ import annotations

import os
import shutil
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


def install_job_image(shared: Path, name: str, image_file: Path) -> Path:
    """``image_file`` as ``images/<name>`` of the shared directory, readable by every job user; an
    unchanged copy (same size, not older) is kept."""
    target = shared / "images" / name
    target.parent.mkdir(mode=0o755, exist_ok=True)
    source = image_file.stat()
    if not (target.exists() and target.stat().st_size == source.st_size and target.stat().st_mtime >= source.st_mtime):
        partial = target.with_name(f".{name}.partial")
        shutil.copyfile(image_file, partial)
        partial.chmod(0o644)
        partial.rename(target)  # a job never starts from half an image
    return target


if __name__ == "__main__":
    stack = load_stack_file(sys.argv[1])
    if stack.storage.type is StorageType.HOST_PATH:
        seed_shared(stack)
        base = Path(stack.storage.host_path.path)
        images = []
        for argument in sys.argv[2:]:
            name, image_file = argument.split("=", 1)
            images.append(install_job_image(base, name, Path(image_file)))
        print(f"[up] shared directory {base} ready (jobs/, {stack.storage.models_path}/"
              f"{''.join(f', images/{image.name}' for image in images)})")
