#!/bin/sh
# slurm.conf TaskProlog: slurmstepd runs it before every task, the batch script included, and removes
# from the task's environment each NAME it prints as "unset NAME" (src/slurmd/slurmstepd/task.c).
#
# SLURM_JWT: sbatch puts every SLURM_* variable of its own environment into the job's, whatever --export
# says (env_merge_filter), so a job submitted with a Slurm token (the submission namespace's Kubernetes
# Jobs) carries that token. srun in it would then authenticate to slurmd with auth/jwt, which slurmd
# does not take ("authentication plugin auth/jwt(102) not found"): every step of the job would fail.
# Its tasks authenticate with the node's munge, as every job's do, and never see the token.
echo "unset SLURM_JWT"
