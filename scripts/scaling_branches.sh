#!/usr/bin/env bash
# experiment=scaling_branches end to end (docs/scaling.md): the trunks as one sweep, a branch from
# each checkpoint each trunk kept (its own run directory), then one scaling report over both.
#   scripts/scaling_branches.sh <folder> [overrides of the trunks, e.g. model.d_model=16,32,64]
# Run again after a stop: finished branches are skipped; continue a killed one with resume=.
set -euo pipefail
shopt -s nullglob  # a trunk that kept no checkpoint has no branches
out=${1:?give the folder for the trunks and the branches}
shift
if [ ! -d "$out/trunks" ]; then
  gptlab-train -m experiment=scaling_branches "hydra.sweep.dir=$out/trunks" "$@"
fi
for trunk in "$out"/trunks/*/; do
  for kept in "$trunk"checkpoints/branch-step=*.ckpt; do
    step=${kept##*=}
    step=${step%.ckpt}
    branch="$out/branches/$(basename "$trunk")-$step"
    [ -f "$branch/metrics.json" ] && continue
    gptlab-train "branch_from=$trunk" "branch_step=$step" "hydra.run.dir=$branch"
  done
done
gptlab-report --scaling "$out"
