"""examples/train_multinode.sbatch: the seed's multi-node training job (srun --container-image ...
torchrun --rdzv-backend=c10d) as the local stack runs it. Here: its shape, and the batch script run
with stand-ins for scontrol and srun (the hosts file, the rendezvous endpoint, the training script it
writes). Its real run (Pyxis, Enroot, PyTorch on two nodes) needs the multi-node tier."""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_multinode.sbatch"
SCRIPT = EXAMPLE.read_text()


def _sbatch_options() -> dict[str, str]:
    options = {}
    for line in SCRIPT.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line.removeprefix("#SBATCH ").partition("=")
            options[key] = value
    return options


def _step() -> list[str]:
    """The srun line's words, the shell's quotes removed (variables left as written)."""
    line = SCRIPT.split("\nsrun ", 1)[1].replace("\\\n", " ").splitlines()[0]
    return shlex.split(line)


def _embedded_training_script() -> str:
    return SCRIPT.split("<<'PYTHON'\n", 1)[1].split("\nPYTHON\n", 1)[0]


def test_the_job_runs_on_two_nodes_one_task_each():
    options = _sbatch_options()
    assert options["--nodes"] == "2" and options["--ntasks-per-node"] == "1"
    assert options["--output"].startswith("/shared/jobs/")


def test_the_step_is_the_seeds_shape_in_a_squashfs_image():
    step = _step()
    [image] = [w.split("=", 1)[1] for w in step if w.startswith("--container-image=")]
    assert image == "$image"
    # Pyxis takes an image argument starting with '/' or '.' as a squashfs file (no registry)
    assert 'image=${TRAIN_IMAGE:-/shared/images/torch.sqsh}' in SCRIPT
    [mounts] = [w.split("=", 1)[1] for w in step if w.startswith("--container-mounts=")]
    assert mounts.split(",")[0] == "/shared:/shared"
    assert mounts.split(",")[1] == "$job_dir/hosts:/etc/hosts:ro"
    torchrun = step[step.index("torchrun"):]
    assert torchrun[:6] == ["torchrun", "--nnodes=$SLURM_NNODES", "--nproc_per_node=1", "--rdzv_backend=c10d",
                            "--rdzv_endpoint=$first_addr:$port", "--rdzv_id=$SLURM_JOB_ID"]
    assert torchrun[6:9] == ["--redirects=1", "--tee=1", "$job_dir/train.py"]


def test_the_training_script_is_python_that_writes_a_complete_checkpoint_atomically():
    source = _embedded_training_script()
    tree = ast.parse(source)
    calls = {node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert {"init_process_group", "all_reduce", "save", "rename"} <= calls
    assert 'init_process_group("gloo")' in source


@pytest.fixture
def fake_slurm(tmp_path):
    """scontrol answering for two nodes with addresses that are not their names; srun recording its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\n"
        'case "$1 $2" in\n'
        '  "show hostnames") printf "gpu-real-2\\ngpu-real-3\\n" ;;\n'
        '  "show node") n=${3#gpu-real-}; echo "NodeName=$3 Arch=x86_64 CoresPerSocket=1"; '
        'echo "   NodeAddr=10.250.0.1$n NodeHostName=$3 Version=22.05.8" ;;\n'
        "  *) exit 1 ;;\n"
        "esac\n"
    )
    (bin_dir / "srun").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$SRUN_ARGV"\n'
                                  'printf "%s\\n" "$NVIDIA_VISIBLE_DEVICES" > "$SRUN_ARGV.env"\n')
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="42",
               SLURM_JOB_NODELIST="gpu-real-[2-3]", SLURM_NNODES="2", TRAIN_JOB_DIR=str(tmp_path / "job"),
               SRUN_ARGV=str(tmp_path / "argv"))
    return tmp_path, env


def test_the_batch_script_gives_the_containers_the_nodes_addresses_and_the_first_as_endpoint(fake_slurm):
    tmp_path, env = fake_slurm
    out = subprocess.run(["bash", str(EXAMPLE)], env=env, capture_output=True, text=True, check=True).stdout
    assert "rendezvous at gpu-real-2 (10.250.0.12:29500)" in out
    job = tmp_path / "job"
    assert (job / "hosts").read_text() == "127.0.0.1 localhost\n10.250.0.12 gpu-real-2\n10.250.0.13 gpu-real-3\n"
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[:2] == ["--container-image=/shared/images/torch.sqsh",
                        f"--container-mounts=/shared:/shared,{job}/hosts:/etc/hosts:ro"]
    assert argv[2:10] == ["torchrun", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                          "--rdzv_endpoint=10.250.0.12:29500", "--rdzv_id=42", "--redirects=1", "--tee=1"]
    assert argv[10:] == [f"{job}/train.py", "--checkpoint-dir", "/shared/models/tiny", "--steps", "20"]
    assert (tmp_path / "argv.env").read_text() == "void\n"  # no GPU hook in a CPU container
    compile((job / "train.py").read_text(), "train.py", "exec")


def test_the_batch_script_takes_image_steps_and_checkpoint_directory_from_the_environment(fake_slurm):
    tmp_path, env = fake_slurm
    env.update(TRAIN_IMAGE="/shared/images/other.sqsh", TRAIN_STEPS="5", TRAIN_CHECKPOINT_DIR="/shared/models/x",
               TRAIN_PORT="29600")
    subprocess.run(["bash", str(EXAMPLE)], env=env, capture_output=True, text=True, check=True)
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[0] == "--container-image=/shared/images/other.sqsh"
    assert "--rdzv_endpoint=10.250.0.12:29600" in argv
    assert argv[-4:] == ["--checkpoint-dir", "/shared/models/x", "--steps", "5"]


def test_the_batch_script_stops_before_srun_when_a_node_has_no_address(fake_slurm):
    tmp_path, env = fake_slurm
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.write_text(scontrol.read_text().replace('echo "   NodeAddr=10.250.0.1$n NodeHostName=$3 Version=22.05.8"',
                                                     'echo "   NodeHostName=$3 Version=22.05.8"'))
    result = subprocess.run(["bash", str(EXAMPLE)], env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "no NodeAddr for node gpu-real-2" in result.stderr
    assert not (tmp_path / "argv").exists()
