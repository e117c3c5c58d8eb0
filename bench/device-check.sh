#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: build kiln with CUDA for sm_90 (Release) unless a
# CUDA build is already in build/, run the GPU tests, then run kiln and the PyTorch peer
# (bench/peers/pytorch_gpt.py) back to back on GPT-2 124M, 350M and 774M at sequence 1024 and
# print one table with the ratio kiln / PyTorch. Everything is measured in this one run.
#
#   bench/device-check.sh [--build]      (--build: rebuild even if build/kiln exists)
#   bench/device-check.sh --prebuilt     use build-pack/ from scripts/pack-for-device.sh (for a
#                                        machine that cannot build kiln: no -dev packages)
#   ... --stages tests,table,levers      which stages run (default tests,table); `levers`: on
#                                        124M/64, what each switch buys (CUDA graphs, fused attention,
#                                        matmul epilogues, selective recomputation, fp8 products; fp8
#                                        also on 774M/16), the attention core
#                                        alone against PyTorch's SDPA, and the time split by op
#                                        (--profile-ops); not part of the 10 minutes
#
# Both sides train in bf16 mixed precision (bf16 weights and activations, fp32 master weights
# and gradient accumulation) at the same micro-batch (no accumulation): kiln against PyTorch's
# eager bf16 autocast (the CUDA back-end issue's bar) and torch.compile (the speed issue's).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kiln-device-check}
mkdir -p "$out"

prebuilt=0 rebuild=0 stages=tests,table
while (($#)); do
  case "$1" in
    --prebuilt) prebuilt=1 ;;
    --build) rebuild=1 ;;
    --stages) stages=${2:?--stages needs a list}; shift ;;
    *) echo "device-check.sh: unknown argument '$1' (--build, --prebuilt, --stages LIST)" >&2; exit 2 ;;
  esac
  shift
done
for stage in ${stages//,/ }; do
  [[ $stage == tests || $stage == table || $stage == levers ]] \
    || { echo "device-check.sh: unknown stage '$stage' (tests, table, levers)" >&2; exit 2; }
done
runs() { [[ ",$stages," == *",$1,"* ]]; }

bin=build
if ((prebuilt)); then
  bin=build-pack
  mkdir -p build-pack/lib
  tar -xJf build-pack/libs.tar.xz -C build-pack/lib
  export LD_LIBRARY_PATH=$PWD/build-pack/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
elif ((rebuild)) || [[ ! -x build/kiln ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
  cmake --build build -j "$(nproc)" --target kiln kiln_tests
fi
kiln=$PWD/$bin/kiln
"$kiln" --version

if runs tests; then
  echo "== GPU tests (CUDA op table, CPU/GPU parity, memory pre-flight)"
  # On a failure: the failures, and the log's end (a crash names no failure; its last test started does).
  KILN_BINARY=$kiln OMP_NUM_THREADS=4 "$PWD/$bin/kiln_tests" --gtest_filter='*cuda*:Cuda*:AllBackends*' \
    > "$out/gpu-tests.log" 2>&1 \
    || { grep -E "FAILED|Failure" "$out/gpu-tests.log" | head -40; tail -20 "$out/gpu-tests.log"; exit 1; }
  grep -E "^\[  PASSED  \]" "$out/gpu-tests.log"
fi

if runs table; then
echo "== GEMM ceilings"
"$kiln" bench gemm | tee "$out/gemm.txt"

results=$out/results.jsonl
: > "$results"
# name layers hidden heads micro-batch
# The CUDA back-end issue's sizes; kiln's plan for them in bf16 (kiln estimate) is 21-36 GiB.
for shape in "124M 12 768 12 64" "350M 24 1024 16 32" "774M 36 1280 20 16"; do
  read -r name layers hidden heads micro <<< "$shape"
  model="--num-layers $layers --hidden-size $hidden --num-attention-heads $heads --seq-length 1024 --micro-batch-size $micro"
  echo "== $name micro-batch $micro"
  "$kiln" bench train --device cuda --bf16 $model --vocab-size 50257 --skip-gemm-ceiling --json \
    | sed "s/^{/{\"model\":\"$name\",\"who\":\"kiln\",/" | tee -a "$results"
  for run in "bf16" "bf16 --compile"; do
    python3 bench/peers/pytorch_gpt.py $model --vocab-size 50257 --precision $run \
      | sed "s/^{/{\"model\":\"$name\",\"who\":\"pytorch\",/" | tee -a "$results"
  done
done

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
print()
print(f"{'model':>6} {'mb':>3} | {'kiln bf16 tok/s':>15} {'GiB':>6} | {'torch bf16 eager':>16} {'GiB':>6} {'ratio':>6} |"
      f" {'torch bf16 compile':>18} {'GiB':>6} {'ratio':>6}")
for model in dict.fromkeys(r["model"] for r in rows):
    kiln = next(r for r in rows if r["model"] == model and r["who"] == "kiln")
    peers = {(r["precision"], "compile" in r["peer"]): r for r in rows if r["model"] == model and r["who"] == "pytorch"}
    eager, comp = peers[("bf16", False)], peers[("bf16", True)]
    k = kiln["tokens_per_second"]
    print(f"{model:>6} {kiln['micro_batch_size']:>3} | {k:>15.0f} {kiln['peak_memory_gib']:>6.1f} |"
          f" {eager['tokens_per_second']:>16.0f} {eager['peak_memory_gib']:>6.1f} {k / eager['tokens_per_second']:>6.2f} |"
          f" {comp['tokens_per_second']:>18.0f} {comp['peak_memory_gib']:>6.1f} {k / comp['tokens_per_second']:>6.2f}")
PY
fi

runs levers || exit 0
echo "== levers on 124M micro-batch 64 (each row one kiln bench train; the first is the table's setting)"
model="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --micro-batch-size 64"
levers=$out/levers.jsonl
: > "$levers"
for switch in "" "--cuda-graph" "--no-fused-attention" "--no-matmul-epilogues" "--recompute-granularity selective" \
              "--fp8-format hybrid" "--fp8-format hybrid --cuda-graph"; do
  "$kiln" bench train --device cuda --bf16 $model --vocab-size 50257 --skip-gemm-ceiling --json $switch \
    | sed "s/^{/{\"switch\":\"${switch:-(defaults)}\",/" >> "$levers"
done
# fp8 where the products weigh most: 774M micro-batch 16, bf16 with and without fp8 products.
for switch in "" "--fp8-format hybrid"; do
  "$kiln" bench train --device cuda --bf16 --num-layers 36 --hidden-size 1280 --num-attention-heads 20 \
    --seq-length 1024 --micro-batch-size 16 --vocab-size 50257 --skip-gemm-ceiling --json $switch \
    | sed "s/^{/{\"switch\":\"774M\/16 ${switch:-(defaults)}\",/" >> "$levers"
done
python3 - "$levers" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
print(f"{'switch':>34} {'ms/iter':>8} {'tok/s':>9} {'GiB':>6}  back-end notes")
for r in rows:
    print(f"{r['switch']:>34} {r['median_ms_per_iteration']:>8.1f} {r['tokens_per_second']:>9.0f}"
          f" {r['peak_memory_gib']:>6.1f}  {r['backend_notes']}")
PY
echo "== attention core alone, bf16 causal: kiln (fused, materialised) and PyTorch SDPA on the same shapes"
attention=$out/attention.jsonl
: > "$attention"
for shape in "64 12 64" "16 16 128" "16 32 80"; do  # batch heads head-size, sequence 1024
  read -r batch heads size <<< "$shape"
  args="--batch $batch --seq-length 1024 --num-attention-heads $heads --head-size $size"
  "$kiln" bench attention --device cuda $args --json >> "$attention"
  "$kiln" bench attention --device cuda $args --no-fused-attention --json >> "$attention"
  python3 bench/peers/pytorch_attention.py $args >> "$attention"
done
python3 - "$attention" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
print(f"{'shape':>22} {'who':>18} {'fwd ms':>8} {'TFLOP/s':>8} {'bwd ms':>8} {'TFLOP/s':>8}")
for r in rows:
    who = r["who"] if r["who"] == "pytorch" else ("kiln fused" if r["fused_attention"] else "kiln materialised")
    shape = f"{r['batch']}x{r['seq_length']} {r['heads']}x{r['head_size']}"
    print(f"{shape:>22} {who:>18} {r['forward_ms']:>8.2f} {r['forward_tflops']:>8.1f} {r['backward_ms']:>8.2f}"
          f" {r['backward_tflops']:>8.1f}")
PY
echo "== time by op, 124M micro-batch 64 (--profile-ops: a device wait after every op)"
"$kiln" bench train --device cuda --bf16 $model --vocab-size 50257 --skip-gemm-ceiling --warmup-iters 2 \
  --timed-iters 5 --profile-ops | tee "$out/profile-124M.txt"
