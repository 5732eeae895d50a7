"""Submitting a Slurm batch job from a Kubernetes Job (the JobSubmission component).

The Job runs in the submission namespace, where dualsched placed the client
slurm.conf, the munge key, the user directory (/etc/passwd and /etc/group) and the
shared file system: `sbatch --wait` submits `/shared/jobs/train.sbatch` to Slurm and
the Kubernetes Job succeeds when the Slurm job does.

The job needs a user: root may not run Slurm jobs (`DisableRootJobs=YES`), and munge
vouches for the uid sbatch runs as, so that uid owns the job and the files it writes on
the shared file system. This example submits as the first user of the stack config
(`dualsched:slurm` → `users`); a stack without users cannot submit jobs.
"""

import pulumi_kubernetes as k8s

from components.cluster import DualScheduledCluster
from components.common import child, meta
from config import StackConfig
from config.models import SlurmUser


def job_user(config: StackConfig) -> SlurmUser:
    """The first configured user; jobs never run as root."""
    if not config.slurm.users:
        raise ValueError(
            "the stack config has no Slurm users to submit the job as: add one under dualsched:slurm → users, "
            "e.g. `users: [{name: alice, uid: 2001}]`"
        )
    return config.slurm.users[0]


def submit_training_job(cluster: DualScheduledCluster, config: StackConfig, name: str = "train-llm") -> k8s.batch.v1.Job:
    user = job_user(config)
    submission = cluster.submission
    return k8s.batch.v1.Job(
        name,
        metadata=meta(namespace=submission.namespace),
        spec=k8s.batch.v1.JobSpecArgs(
            backoff_limit=0,
            template=k8s.core.v1.PodTemplateSpecArgs(
                spec=submission.sbatch_pod_spec("jobs/train.sbatch", user, ("--partition=gpu", "--gres=gpu:4", "--nodes=2")),
            ),
        ),
        opts=child(cluster),
    )
