"""Submitting a Slurm batch job from a Kubernetes Job (the JobSubmission component).

The Job runs in the submission namespace as a ServiceAccount that the stack config maps to a
Slurm user (`dualsched:submission` → `identities`). Its token sidecar trades the pod's projected
ServiceAccount token for a short-lived Slurm token at the in-cluster minter; sbatch presents that
token, so the pod needs no munge key, and slurmctld runs the job as the mapped user, who owns
the files it writes on the shared file system. The Kubernetes Job succeeds when the Slurm job
completes.

A stack without identities cannot submit: say which ServiceAccount may act as which user.

    python -m dualsched.components.render --stack dev --program dualsched.examples.sbatch_job:program --out build/sbatch
"""

import pulumi_kubernetes as k8s

from dualsched.components.cluster import DualScheduledCluster
from dualsched.components.common import child, meta
from dualsched.components.program import build
from dualsched.config import StackConfig
from dualsched.config.models import SubmissionIdentity

TRAINING_SCRIPT = """#!/bin/bash
#SBATCH --job-name=train-llm
#SBATCH --partition=gpu
#SBATCH --nodes=2
#SBATCH --gres=gpu:4
#SBATCH --output=/shared/jobs/train-llm-%j.out
srun python /shared/jobs/train.py --checkpoint-dir /shared/models/llm
"""


def job_identity(config: StackConfig) -> SubmissionIdentity:
    """The first configured identity; jobs never run as root or as an unmapped account."""
    if not config.submission.identities:
        raise ValueError(
            "the stack config maps no ServiceAccount to a Slurm user: add one under dualsched:submission → "
            "identities, e.g. `identities: [{serviceAccount: trainer, user: alice}]`"
        )
    return config.submission.identities[0]


def submit_training_job(cluster: DualScheduledCluster, config: StackConfig, name: str = "train-llm") -> k8s.batch.v1.Job:
    submission = cluster.submission
    if submission is None:
        raise ValueError("the stack deploys no job submission (submission.enabled is false)")
    return k8s.batch.v1.Job(
        name,
        metadata=meta(namespace=submission.namespace),
        spec=k8s.batch.v1.JobSpecArgs(
            backoff_limit=0,
            template=k8s.core.v1.PodTemplateSpecArgs(spec=submission.sbatch_pod_spec(TRAINING_SCRIPT, job_identity(config))),
        ),
        opts=child(cluster),
    )


def program(config: StackConfig) -> k8s.batch.v1.Job:
    """dualsched's program for the stack, and the training Job."""
    return submit_training_job(build(config), config)
