#!/bin/bash
# tunebench run sft: SLURM job for run llama70b (261202-ab12), written by tunebench.
# Submit: sbatch /shared/runs/llama70b/sbatch.sh   (tunebench run --slurm does, when sbatch is present)
#SBATCH --job-name=tunebench-llama70b
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --partition=gpu
#SBATCH --time=24:00:00
#SBATCH --account=ml
#SBATCH --qos=high
#SBATCH --output=/shared/runs/llama70b/slurm-%j.log
set -euo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=/opt/tunebench"${PYTHONPATH:+:$PYTHONPATH}"
if [[ "${1:-}" == "--node" ]]; then  # one task per node (srun below): this node's torchrun
  exec /opt/venv/bin/python -m torch.distributed.run --nnodes=2 --node-rank="$SLURM_NODEID" --rdzv-backend=static --rdzv-endpoint="$TUNEBENCH_RDZV_HOST:$TUNEBENCH_RDZV_PORT" --max-restarts=0 --nproc_per_node=8 -m engine.recipes.sft --config /shared/runs/llama70b/config.yaml
fi
# what the run creates in the shared folder is recorded as its own (workbench.run_manifest)
tunebench_record() { /opt/venv/bin/python -m workbench.run_manifest record-new /shared/runs/llama70b || true; }
trap tunebench_record EXIT
tunebench_record
TUNEBENCH_NODES=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
TUNEBENCH_RDZV_HOST=${TUNEBENCH_NODES%%$'\n'*}
TUNEBENCH_RDZV_PORT=$((29500 + SLURM_JOB_ID % 1000))
export TUNEBENCH_RDZV_HOST TUNEBENCH_RDZV_PORT
srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash /shared/runs/llama70b/sbatch.sh --node
