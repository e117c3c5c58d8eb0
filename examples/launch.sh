#!/usr/bin/env bash
# kiln launch, torchrun's job, where there is no Slurm: the layouts of examples/slurm/*.sbatch
# started by hand. Run from the repository root.
#
#   examples/launch.sh cpu                  2 CPU ranks on this machine over Gloo
#   examples/launch.sh cpu-2-nodes          2 nodes x 2 CPU ranks: run it on each node, with
#                                           NODE_RANK=0 or 1 and MASTER_ADDR=<node 0's name>
#   examples/launch.sh gpu                  2 GPUs on this machine
#   examples/launch.sh gpu-2-nodes          2 nodes x 2 GPUs, like examples/slurm/gpt-2x2.sbatch
#
# Flags after the layout go to kiln train, after the ones below (so they win):
#   examples/launch.sh cpu --train-iters 100 --log-interval 10
#
# The gpu layouts talk over NCCL (docs/many-ranks.md). NOTE: NCCL has run in a group of one GPU
# only (the one GPU lent to this project); several GPUs are unrun.
#
# What changes between one node and two is the launch line alone: --standalone (rank 0 on
# 127.0.0.1, a free port) becomes --nnodes 2 --node-rank R --master-addr A --master-port P, the
# same on both nodes but for --node-rank. Each worker gets RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; kiln train reads them, so there is no wrapper.
# Under Slurm, use srun instead (examples/slurm/): kiln reads SLURM_PROCID etc. itself.
#
# Preemption: kiln launch forwards SIGTERM and SIGINT to its workers. With --exit-signal-handler
# each rank finishes its iteration, rank 0 saves a checkpoint and the workers exit 0 (the launcher
# itself then exits 128 + the signal, as torchrun does); --exit-duration-in-mins stops the run the
# same way once it has lasted that long. --save and --load name the same folder, so the same
# command resumes from the last checkpoint (a --load folder with no checkpoint yet starts afresh),
# also after --max-restarts starts a failed group again (one node).
set -euo pipefail
cd "$(dirname "$0")/.."

KILN=${KILN:-build/kiln}
layout=${1:?"usage: examples/launch.sh cpu | cpu-2-nodes | gpu | gpu-2-nodes [kiln train flags] (see the comments at the top)"}
shift
MASTER_PORT=${MASTER_PORT:-29500}

# Where rank 0 is: this machine, or node 0 of two (the same on both nodes but for --node-rank).
if [[ $layout == *-2-nodes ]]; then
  : "${NODE_RANK:?set NODE_RANK to the index of this node, 0 or 1}"
  : "${MASTER_ADDR:?set MASTER_ADDR to the name of node 0}"
  where=(--nnodes 2 --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT")
else
  # One node: a failed group is started again, resuming from the last checkpoint (on two nodes a
  # scheduler's requeue does that: restart the job on both nodes together).
  where=(--standalone --max-restarts 3)
fi

case "$layout" in
  cpu | cpu-2-nodes)
    # The demo's GPT (examples/demo.yaml; `make demo` writes its data). Global batch 16: micro 8 x
    # 2 ranks x 1 on one node, micro 4 x 4 ranks x 1 on two.
    if [[ $layout == cpu ]]; then micro=8; else micro=4; fi
    run=${RUN:-demo-run/$layout}
    # Each worker gets 1 OpenMP thread unless OMP_NUM_THREADS says otherwise.
    exec "$KILN" launch "${where[@]}" --nproc-per-node 2 -- \
      "$KILN" train --config examples/demo.yaml --device cpu --distributed-backend gloo \
      --micro-batch-size "$micro" --save "$run" --load "$run" \
      --exit-signal-handler --exit-duration-in-mins 55 "$@"
    ;;
  gpu | gpu-2-nodes)
    # GPT-2 small (examples/gpt2-124m.yaml), one worker per GPU; a rank's GPU will be its
    # LOCAL_RANK. Global batch 512 = micro 8 x ranks x accumulation, whatever the layout.
    run=${RUN:-runs/gpt2-124m-$layout}
    exec "$KILN" launch "${where[@]}" --nproc-per-node 2 -- \
      "$KILN" train --config examples/gpt2-124m.yaml --device cuda --bf16 \
      --data-path "${DATA:-data/gpt2_text_document}" --save "$run" --load "$run" \
      --exit-signal-handler --exit-duration-in-mins 230 "$@"
    ;;
  *)
    echo "examples/launch.sh: unknown layout '$layout': cpu, cpu-2-nodes, gpu or gpu-2-nodes" >&2
    exit 2
    ;;
esac
