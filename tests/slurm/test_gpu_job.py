"""Scenario 2: a GPU batch job gets a GPU and accounting records it."""

import pytest

pytestmark = pytest.mark.slurm


def test_gpu_job_sees_its_gpu_and_is_accounted_with_gres(cluster):
    job = cluster.sbatch(
        "--partition=gpu", "--gres=gpu:1", "--mem=100M", "--time=5",
        script='echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}"\n'
               'echo "SLURM_JOB_GPUS=${SLURM_JOB_GPUS:-unset}"\n',
    )  # fmt: skip

    finished = cluster.wait_for_job(job, "COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT")
    assert finished["JobState"] == "COMPLETED", finished
    assert finished["NodeList"] == cluster.local_node

    output = cluster.job_output(job)
    assert "CUDA_VISIBLE_DEVICES=0\n" in output, output
    assert "SLURM_JOB_GPUS=0\n" in output, output

    record = cluster.wait_for_accounting(job, "COMPLETED")
    assert record["Partition"] == "gpu"
    assert "gres/gpu=1" in record["AllocTRES"].split(","), record
