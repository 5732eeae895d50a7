"""The node tier's Pulumi program: the project's own program, plus Kubernetes Jobs that submit
Slurm batch jobs when the stack sets ``nodetest:jobs`` (the seed's approach 2).

Each Job's pod is the library's :meth:`JobSubmission.sbatch_pod_spec`, as a user would build it.
A job may name a ServiceAccount the config does not map (the program then creates it, as anyone
with access to the namespace could) or force another uid: the refusals the tier checks.
"""

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import child, locked_down, meta
from dualsched.components.program import build
from dualsched.config import load_pulumi_config
from dualsched.config.models import SubmissionIdentity

config = load_pulumi_config()
cluster = build(config)
mapped = {identity.service_account: identity for identity in config.submission.identities}
for job in pulumi.Config("nodetest").get_object("jobs") or []:
    identity = mapped.get(job["serviceAccount"])
    depends_on = []
    if identity is None:
        identity = SubmissionIdentity(service_account=job["serviceAccount"], user=job["user"])
        depends_on.append(
            k8s.core.v1.ServiceAccount(
                job["serviceAccount"],
                metadata=meta(name=job["serviceAccount"], namespace=cluster.submission.namespace),
                opts=child(cluster),
            )
        )
    spec = cluster.submission.sbatch_pod_spec(job["script"], identity, tuple(job["args"]))
    if "uid" in job:  # every uid the pod names, as its author could write them
        spec.security_context = k8s.core.v1.PodSecurityContextArgs(run_as_user=job["uid"], run_as_group=job["uid"])
        for container in [*spec.init_containers, *spec.containers]:
            container.security_context = locked_down(run_as_user=job["uid"])
    k8s.batch.v1.Job(
        job["name"],
        metadata=meta(
            name=job["name"],
            namespace=cluster.submission.namespace,
            # the test waits for the Job itself, and reads its logs when it fails
            annotations={"pulumi.com/skipAwait": "true"},
        ),
        spec=k8s.batch.v1.JobSpecArgs(
            backoff_limit=0,
            template=k8s.core.v1.PodTemplateSpecArgs(spec=spec),
        ),
        opts=child(cluster, depends_on=depends_on),
    )
