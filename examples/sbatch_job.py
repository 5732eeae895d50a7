"""Submitting a Slurm batch job from a Kubernetes Job (the JobSubmission component).

The Job runs in the submission namespace, where dualsched placed the client
slurm.conf, the munge key and the shared file system: `sbatch --wait` submits
`/shared/jobs/train.sbatch` to Slurm and the Kubernetes Job succeeds when the
Slurm job does.
"""

import pulumi_kubernetes as k8s

from components.cluster import DualScheduledCluster
from components.common import child, meta


def submit_training_job(cluster: DualScheduledCluster, name: str = "train-llm") -> k8s.batch.v1.Job:
    submission = cluster.submission
    return k8s.batch.v1.Job(
        name,
        metadata=meta(namespace=submission.namespace),
        spec=k8s.batch.v1.JobSpecArgs(
            backoff_limit=0,
            template=k8s.core.v1.PodTemplateSpecArgs(
                spec=submission.sbatch_pod_spec("jobs/train.sbatch", ("--partition=gpu", "--gres=gpu:4", "--nodes=2")),
            ),
        ),
        opts=child(cluster),
    )
