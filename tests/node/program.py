"""The node tier's Pulumi program: the project's own program, plus a Kubernetes Job that
submits a Slurm batch job when the stack sets ``nodetest:job`` (the seed's approach 2).

The Job's pod is the library's :meth:`JobSubmission.sbatch_pod_spec`, as a user would build it.
"""

import pulumi
import pulumi_kubernetes as k8s

from components.common import child, meta
from components.program import build
from config import load_pulumi_config

config = load_pulumi_config()
cluster = build(config)
job = pulumi.Config("nodetest").get_object("job")
if job:
    user = next(user for user in config.slurm.users if user.name == job["user"])
    k8s.batch.v1.Job(
        job["name"],
        metadata=meta(
            namespace=cluster.submission.namespace,
            # the test waits for the Job itself, and reads its logs when it fails
            annotations={"pulumi.com/skipAwait": "true"},
        ),
        spec=k8s.batch.v1.JobSpecArgs(
            backoff_limit=0,
            template=k8s.core.v1.PodTemplateSpecArgs(
                spec=cluster.submission.sbatch_pod_spec(job["script"], user, tuple(job["args"])),
            ),
        ),
        opts=child(cluster),
    )
