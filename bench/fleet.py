"""Generated fleet-sized stack configs, built from the config models in code.

``fleet_config(nodes)``: ``nodes`` GPU nodes of 8 GPUs in 8 pools (6 dedicated
to Slurm, 2 partitioned 6/2 with inference), a partition over all pools plus
one per pool, four vLLM models, Lustre, an external accounting database and an
HA controller, as a prod fleet would be. The result passes every cross-field
check (it is validated like any stack, so the benchmark measures a real config).
"""

from __future__ import annotations

from dualsched.config.models import (
    Accounting,
    AccessMode,
    Controller,
    Database,
    DatabaseMode,
    Environment,
    ExternalDatabase,
    Inference,
    InferenceModel,
    LustreMgsNode,
    LustreStorage,
    Network,
    NodeAllocatable,
    NodePool,
    Partition,
    PoolMode,
    Replicas,
    SecretKeyRef,
    SharedStorage,
    Slurm,
    StackConfig,
    StateStorage,
    StorageType,
)

POOLS = 8
GPUS_PER_NODE = 8
PARTITIONED_POOLS = 2


def pool_name(index: int) -> str:
    return f"pool-{index}"


VARIANTS = ("base", "pool", "conf")
"""``base``; ``pool``: one pool changed (pool-7's Slurm GPU share 6 -> 4: its nodes' labels, its slurmd
DaemonSet and slurm.conf); ``conf``: ``pool`` plus a partition (slurm.conf only, relative to ``pool``)."""


def fleet_config(nodes: int, variant: str = "base") -> StackConfig:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}")
    if nodes % POOLS:
        raise ValueError(f"nodes must be a multiple of {POOLS}")
    per_pool = nodes // POOLS
    pools = []
    for index in range(POOLS):
        partitioned = index >= POOLS - PARTITIONED_POOLS
        pools.append(
            NodePool(
                name=pool_name(index),
                nodes=f"gpu-{index}-[0001-{per_pool:04d}]",
                mode=PoolMode.PARTITIONED if partitioned else PoolMode.DEDICATED,
                gpus_per_node=GPUS_PER_NODE,
                slurm_gpus=(4 if variant != "base" and index == POOLS - 1 else 6) if partitioned else None,
                gpu_type="h100",
                cpus=96 if partitioned else 188,
                real_memory_mb=900_000 if partitioned else 1_900_000,
                allocatable=NodeAllocatable(cpus=191, memory_mb=1_950_000),
            )
        )
    partitions = [Partition(name="all", pools=tuple(p.name for p in pools), default=True, max_time="7-00:00:00")]
    partitions += [Partition(name=p.name, pools=(p.name,), max_time="2-00:00:00") for p in pools]
    if variant == "conf":
        partitions.append(Partition(name="debug", pools=(pools[0].name,), max_time="01:00:00"))
    models = tuple(
        InferenceModel(name=f"model-{index}", path=f"org/model-{index}", gpus=1 + index % 2, replicas=Replicas(min=1, max=8))
        for index in range(4)
    )
    config = StackConfig(
        environment=Environment.PROD,
        slurm=Slurm(
            cluster_name=f"fleet{nodes}",
            controller=Controller(ha=True, state_storage=StateStorage(size="50Gi", access_mode=AccessMode.READ_WRITE_MANY)),
            partitions=tuple(partitions),
            accounting=Accounting(
                database=Database(
                    mode=DatabaseMode.EXTERNAL,
                    external=ExternalDatabase(host="acct.db.internal", password_secret=SecretKeyRef(name="slurmdbd-db")),
                )
            ),
        ),
        pools=tuple(pools),
        storage=SharedStorage(
            type=StorageType.LUSTRE,
            capacity="2Pi",
            lustre=LustreStorage(mgs_nodes=(LustreMgsNode(nids=("10.0.0.1@o2ib",)),), fs_name="fs1"),
        ),
        inference=Inference(models=models),
        network=Network(node_cidrs=("10.0.0.0/16",), api_server_cidrs=("10.1.0.1/32",)),
    )  # StackConfig runs the cross-field checks itself: an invalid fleet raises here
    return config
