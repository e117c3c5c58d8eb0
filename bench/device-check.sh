#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: build kiln with CUDA for sm_90a (Release) unless a
# CUDA build is already in build/, run the GPU tests, then run kiln and the PyTorch peer
# (bench/peers/pytorch_gpt.py) back to back on GPT-2 124M, 350M and 774M at sequence 1024 and
# print one table with the ratio kiln / PyTorch: kiln in bf16, in bf16 on cuDNN's attention engines
# (--cudnn-attention, cuDNN from PyTorch's wheel where it has one), with fp8 products (--fp8-format
# hybrid), with fp8 products and cuDNN's attention, and with the classifier's products in fp8 too
# (--fp8-classifier) and the loss on 16384 positions a chunk (--loss-chunk-rows), the fastest
# measured, that also with each product's algorithm chosen by timing (--matmul-autotune), against
# PyTorch's bf16 torch.compile, each row with its last loss (kiln bench train refuses losses a GPT
# on random tokens cannot give), and a verdict per size against the speed issue's bar (1.25x
# PyTorch's faster run, peak memory below PyTorch's). Everything is measured in this one run.
#
#   bench/device-check.sh [--build]      (--build: rebuild even if build/kiln exists)
#   bench/device-check.sh --prebuilt     use build-pack/ from scripts/pack-for-device.sh (for a
#                                        machine that cannot build kiln: no -dev packages)
#   ... --deadline SECONDS               start no run that may not end SECONDS after this script
#                                        started, and stop any at that time; what is skipped is
#                                        named at the end, the summaries still print. A device call
#                                        of 15 minutes' budget: --deadline 420 with timeout_s 500
#                                        (docs/gpu.md)
#   ... --sizes 124M,350M                which sizes the table stage runs (default all three)
#   ... --eager                          the table runs PyTorch eager too (the CUDA back-end issue's
#                                        bar; off: the speed issue's bar is torch.compile)
#   ... --stages tests,table,levers      which stages run (default tests,table); `levers`: first the
#                                        time split by op (--profile-ops: the table's fastest setting
#                                        at 124M/64 and at 350M/32; at 124M/64 bf16 and with fp8
#                                        products), then on 124M/64 what each switch buys (CUDA graphs,
#                                        fused attention, on wgmma or mma.sync, its backward adding dQ
#                                        atomically, matmul epilogues, products' algorithms timed,
#                                        selective recomputation, fp8 products, alone, with their
#                                        forward products' fast accumulation off, with CUDA graphs,
#                                        with their algorithms timed and with the classifier's products
#                                        in fp8 too, also on 16384 positions a chunk; the classifier
#                                        and loss on 16384 positions a chunk; cuDNN's attention, alone
#                                        and with CUDA graphs), and the attention core (kiln's kernels,
#                                        cuDNN's) alone against PyTorch's SDPA; not part of the 10
#                                        minutes
#   ... --stages counters                Nsight Compute's counters (ncu: speed of light, occupancy,
#                                        warp stalls) of the attention kernels at 64x1024 12x64
#                                        (kiln's on mma.sync, adding dQ atomically, on wgmma; SDPA's;
#                                        cuDNN's through --cudnn-attention),
#                                        of every kernel of a 2-layer 124M/64 step (bf16, fp8 products)
#                                        and of PyTorch eager's products on it: NAME.txt (details),
#                                        NAME.csv (every metric) and NAME.ncu-rep under $OUT; about
#                                        5 minutes
#   ... --stages nccl                    NCCL in a group of one rank (the only group one GPU allows):
#                                        kiln bench comm over nccl under kiln launch --nproc-per-node 1,
#                                        and a small GPT trained alone, then launched over nccl with
#                                        data parallelism's buckets and with ZeRO-1: the three logs'
#                                        losses and gradient norms must be the same; under a minute
#   ... --stages loss                    fp8 against bf16 on real text: GPT-2 124M's shape trained
#                                        300 steps on the State of the Union addresses (GPT-2 BPE;
#                                        scripts/pack-for-device.sh packs them), the same seed and
#                                        batches, in bf16, in the table's fastest setting (the
#                                        verdict's), in bf16 perturbed (its attention backward adding
#                                        dQ atomically: how far two runs drift that differ in rounding
#                                        alone), with fp8 products, with the classifier's products in
#                                        fp8 too, and in bf16 on cuDNN's attention; each run's losses
#                                        and its largest gap to bf16's; about 2 minutes
#   ... --stages seedlab                 the seed lab's model (the encoder classifier: 18 layers x 1280,
#                                        20 heads, seq 512, vocabulary 30000, micro-batch 5) in kiln
#                                        bench train against PyTorch eager (bench/peers/
#                                        pytorch_seed_lab.py), back to back a row: fp32, TF32, fp16,
#                                        bf16, each without and with per-block checkpointing, and bf16
#                                        with 3 micro-batches accumulated; one table of samples/s, the
#                                        ratio, peak memory and a verdict against the speed issue's bar
#                                        (1.5x, less memory) by bench/seed_lab.py; seedlab.jsonl and
#                                        seedlab.txt under $OUT; about 4 minutes (estimated, not yet
#                                        measured); under --deadline its rows stop being started
#   ... --bundle                         at the end, pack every file written under $OUT but the .ncu-rep
#                                        reports into $OUT/device-check.tar.gz, and the reports into
#                                        $OUT/ncu-reports.tar.gz (for a transfer that takes few files)
#   bench/device-check.sh --rehearse BUILD_DIR
#                                        a dry run of the other stages on a machine without
#                                        a GPU (CI): BUILD_DIR/kiln_on_emulator (the CUDA back-end on
#                                        the CPU emulator) on shapes 100s of times smaller, and
#                                        tests/support/stand_in_peer.py for PyTorch (and the
#                                        counters stage with tests/support/stand_in_ncu.py), the loss
#                                        stage on a few steps of a tiny GPT. It checks
#                                        the plumbing only: its numbers measure nothing.
#                                        --stages seedlab after --rehearse runs that stage too, the
#                                        real peer on the CPU (a python3 with torch: Debian's
#                                        python3-torch) against the emulator at a tiny shape.
#
# A failing test or measurement does not stop the run (device time is scarce): the failures are
# printed, the row says "failed", the other rows are still measured, and the exit status is 1.
#
# Both sides train in bf16 mixed precision (bf16 weights and activations, fp32 master weights
# and gradient accumulation) at the same micro-batch (no accumulation): kiln against PyTorch's
# eager bf16 autocast (the CUDA back-end issue's bar) and torch.compile (the speed issue's).
# shellcheck disable=SC2086  # option lists ($model, $timing, $switch, ...) are split into words on purpose
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kiln-device-check}
mkdir -p "$out"

prebuilt=0 rebuild=0 bundle=0 rehearse="" stages=tests,table sizes="" eager=0 deadline=0
while (($#)); do
  case "$1" in
    --prebuilt) prebuilt=1 ;;
    --build) rebuild=1 ;;
    --bundle) bundle=1 ;;
    --eager) eager=1 ;;
    --stages) stages=${2:?--stages needs a list}; shift ;;
    --sizes) sizes=${2:?--sizes needs a list}; shift ;;
    --deadline) deadline=${2:?--deadline needs seconds}; shift
                [[ $deadline =~ ^[1-9][0-9]*$ ]] ||
                  { echo "device-check.sh: --deadline '$deadline' is not a whole number of seconds" >&2; exit 2; } ;;
    --rehearse) rehearse=${2:?--rehearse needs the build directory}; stages=table,levers,counters,loss; shift ;;
    *) echo "device-check.sh: unknown argument '$1' (--build, --prebuilt, --stages LIST, --sizes LIST, --eager," \
            "--deadline SECONDS, --bundle, --rehearse DIR)" >&2
       exit 2 ;;
  esac
  shift
done
for stage in ${stages//,/ }; do
  [[ $stage == tests || $stage == table || $stage == levers || $stage == counters || $stage == loss ||
     $stage == nccl || $stage == seedlab ]] \
    || { echo "device-check.sh: unknown stage '$stage' (tests, table, levers, counters, loss, nccl, seedlab)" >&2
         exit 2; }
done
runs() { [[ ",$stages," == *",$1,"* ]]; }

# What is measured: GPT shapes "name layers hidden heads micro-batch" at sequence $seq, the
# attention shapes "batch heads head-size", and the peers.
seq=1024 vocab=50257 timing="" gemm_sizes=""
datasheet=""  # kiln bench train finds the GPU's datasheet by its name
shapes=("124M 12 768 12 64" "350M 24 1024 16 32" "774M 36 1280 20 16")
lever_shape=${shapes[0]} lagging_shape=${shapes[1]}  # the levers' shape; the size furthest from the bar
attention_shapes=("64 12 64" "16 16 128" "16 32 80")
# kiln's fastest setting as measured on an H100 (bench/NOTES.md, 2026-11-27: 1.44x, 1.43x and 1.49x
# torch.compile): fp8 products (E4M3 forward, E5M2 gradients; bf16 everywhere else), the
# classifier's too, on cuDNN's attention engines, the classifier and loss on 16384 positions a
# chunk, each product's cuBLASLt algorithm chosen by timing (-1.6 to -2.2 ms a step). The table's
# verdict rows and the levers stage's first profiles run it; the table's next row runs it untimed
# (`untuned`): the verdict's fallback, and what the timing buys in this setting.
fastest_switches="--fp8-format hybrid --fp8-classifier --cudnn-attention --loss-chunk-rows 16384"
fastest="fp8 cls cudnn 16k tuned:$fastest_switches --matmul-autotune" untuned="fp8 cls cudnn 16k:$fastest_switches"
# The loss stage: "layers hidden heads micro-batch", steps, logging; its text is tokenized into
# loss-data/ beside the binaries (scripts/prepare-loss-data.sh).
loss_shape="12 768 12 16" loss_iters=300 loss_logging="--log-interval 10 --eval-interval 100 --eval-iters 4"
# The nccl stage: kiln bench comm's sizes, and the GPT "layers hidden heads micro-batch" it trains.
comm_sizes="-b 8 -e 256M -f 4" nccl_shape="4 512 8 8"
peer_gpt=(python3 bench/peers/pytorch_gpt.py)
peer_attention=(python3 bench/peers/pytorch_attention.py)
ncu=(ncu)
# The seedlab stage: bench/seed_lab.py's options beyond the kiln binary and the deadline (its
# defaults are the lab's shape, 3 warm-up and 6 timed iterations a run, each run given 30 s).
seedlab_options="--device cuda --reserve-kiln 30 --reserve-peer 30"
# model_flags SHAPE: the flags kiln and the peer share for the shape "name layers hidden heads micro-batch"
model_flags() {
  local name layers hidden heads micro
  read -r name layers hidden heads micro <<< "$1"
  echo "--num-layers $layers --hidden-size $hidden --num-attention-heads $heads --seq-length $seq --micro-batch-size $micro"
}

bin=build kiln=$PWD/build/kiln
if [[ -n $rehearse ]]; then
  echo "== REHEARSAL on the CUDA emulator: tiny shapes and a stand-in peer; no number below is a measurement"
  kiln=$(cd "$rehearse" && pwd)/kiln_on_emulator
  seq=32 vocab=256 timing="--warmup-iters 1 --timed-iters 1" gemm_sizes="--m 64 --n 48 --k 32 --iters 1"
  datasheet="--gpu h100-sxm"  # the emulator's name is in no datasheet
  shapes=("124M 1 32 2 2" "350M 2 32 2 1" "774M 1 48 3 1")
  lever_shape=${shapes[0]} lagging_shape=${shapes[1]}
  attention_shapes=("1 2 64" "1 1 80")
  loss_shape="1 32 2 2" loss_iters=4 loss_logging="--log-interval 2 --eval-interval 2 --eval-iters 1"
  comm_sizes="-b 8 -e 4K -f 8 -n 2 -w 1" nccl_shape="1 32 2 2"
  peer_gpt=(python3 tests/support/stand_in_peer.py gpt)
  peer_attention=(python3 tests/support/stand_in_peer.py attention)
  ncu=(python3 tests/support/stand_in_ncu.py)
  seedlab_options="--device cuda --peer-device cpu --num-layers 1 --hidden-size 32 --num-attention-heads 2
                   --seq-length 16 --vocab-size 256 --micro-batch-size 2 --warmup-iters 1 --timed-iters 1
                   --reserve-kiln 10 --reserve-peer 20"
elif ((prebuilt)); then
  bin=build-pack kiln=$PWD/build-pack/kiln
  mkdir -p build-pack/lib
  tar -xJf build-pack/libs.tar.xz -C build-pack/lib
  export LD_LIBRARY_PATH=$PWD/build-pack/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
elif ((rebuild)) || [[ ! -x build/kiln ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
  cmake --build build -j "$(nproc)" --target kiln kiln_tests
fi
# --sizes: the table's shapes by name (the levers stage keeps 124M's)
if [[ -n $sizes ]]; then
  chosen=()
  for size in ${sizes//,/ }; do
    found=""
    for shape in "${shapes[@]}"; do
      if [[ ${shape%% *} == "$size" ]]; then found=$shape; fi
    done
    [[ -n $found ]] || { echo "device-check.sh: unknown size '$size' (124M, 350M, 774M)" >&2; exit 2; }
    chosen+=("$found")
  done
  shapes=("${chosen[@]}")
fi
# NCCL, which kiln links (dist/nccl/): PyTorch's own where its wheel has one (pack-for-device.sh
# leaves the toolkit's 200 MB library behind); else whatever the loader finds.
nccl_dir=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0] + "/lib")' 2> /dev/null || true)
if [[ -z $rehearse && -n $nccl_dir && -e $nccl_dir/libnccl.so.2 ]]; then
  export LD_LIBRARY_PATH=$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "NCCL: $nccl_dir"
fi
"$kiln" --version
# cuDNN for --cudnn-attention (dlopen'ed: cuda/cudnn_api.h): PyTorch's own where its wheel has one, so
# that kiln and the peer run the same library; else whatever the loader finds (the emulator has a
# stand-in of its own).
cudnn_dir=$(python3 -c 'import nvidia.cudnn as c; print(list(c.__path__)[0] + "/lib")' 2> /dev/null || true)
if [[ -z $rehearse && -n $cudnn_dir && -e $cudnn_dir/libcudnn.so.9 ]]; then
  export LD_LIBRARY_PATH=$cudnn_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "cuDNN for --cudnn-attention: $cudnn_dir"
  # and the NVRTC beside it, which cuDNN's runtime-compiled engines (its attention ones among them)
  # load by name, as PyTorch's process has it loaded
  nvrtc_dir=$(python3 -c '
import glob, os, nvidia
hits = [h for root in nvidia.__path__ for h in glob.glob(os.path.join(root, "**", "libnvrtc.so*"), recursive=True)]
print(os.path.dirname(sorted(hits)[0]) if hits else "")' 2> /dev/null || true)
  if [[ -n $nvrtc_dir ]]; then
    export LD_LIBRARY_PATH=$nvrtc_dir:$LD_LIBRARY_PATH
    echo "NVRTC for cuDNN's runtime-compiled engines: $nvrtc_dir"
  fi
fi

failures=() skipped=()
# --deadline: every run starts only if the time it may take (its reserve, in seconds) fits before
# the deadline, counted from this script's start, and is stopped at the deadline; a run that does
# not fit is skipped and named at the end. The summaries and the bundle are written after the
# deadline, in seconds: a device call that allows the deadline and a minute gets them back.
fits() { ((deadline == 0 || SECONDS + $1 <= deadline)); }
bounded() {
  if ((deadline)); then timeout $((deadline > SECONDS ? deadline - SECONDS : 1)) "$@"; else "$@"; fi
}
skip() {
  skipped+=("$1")
  echo "SKIPPED (deadline ${deadline} s, ${SECONDS} s gone): $1" >&2
}
# measure FILE FIELDS RESERVE COMMAND...: runs a command that prints one JSON object, and appends
# that object to FILE with FIELDS ('"key":"value",...') and its wall time in seconds ("wall_s") in
# front. A command that fails or prints no object is counted, its error output shown, and recorded
# as {FIELDS, "failed": true}; one that does not fit before the deadline as {FIELDS, "skipped": true}.
measure() {
  local file=$1 fields=$2 reserve=$3 line started=$SECONDS
  shift 3
  if ! fits "$reserve"; then
    skip "${fields//\"/}"
    echo "{$fields,\"skipped\":true}" >> "$file"
  elif line=$(bounded "$@" 2> "$out/stderr.txt" | grep '^{' | tail -1) && [[ -n $line ]]; then
    echo "{$fields,\"wall_s\":$((SECONDS - started)),${line#\{}" | tee -a "$file"
  else
    failures+=("$*")
    echo "FAILED after $((SECONDS - started)) s: $*" >&2
    tail -5 "$out/stderr.txt" >&2
    echo "{$fields,\"failed\":true}" | tee -a "$file"
  fi
}
# What a run may take at most, for the deadline (seconds, with room over the wall times measured on
# an H100 on 2026-11-27, bench/NOTES.md): kiln bench train 7-38 s (start-up, cuDNN's plans compiled
# by NVRTC, algorithms timed, 13 steps); kiln train's 300 loss-stage steps about 17 s (three in 53);
# the PyTorch peer compiled 47-94 s (inductor's compilation of up to a 36-layer GPT), eager not yet
# timed; one bench attention 3-10 s; one ncu run not yet timed.
reserve_kiln=40 reserve_loss=30 reserve_eager=60 reserve_compile=150 reserve_attention=20 reserve_ncu=120

if runs tests && ! fits 60; then
  skip "the GPU tests"
elif runs tests; then
  echo "== GPU tests (CUDA op table, CPU/GPU parity, memory pre-flight, cuDNN's engines for kiln's graphs)"
  # On a failure: the failures, and the log's end (a crash names no failure; its last test started does).
  if KILN_BINARY=$kiln OMP_NUM_THREADS=4 bounded "$PWD/$bin/kiln_tests" \
      --gtest_filter='*cuda*:Cuda*:AllBackends*:CudnnGraphCheck*:*/CudnnGraphCheck*' > "$out/gpu-tests.log" 2>&1; then
    grep -E "^\[  PASSED  \]" "$out/gpu-tests.log"
    # this GPU as cuDNN describes it: what tests/backend/cudnn_graph_check_test.cpp's H100 stands in for
    sed -n 's/^this GPU, as cuDNN describes it: //p' "$out/gpu-tests.log" | tee "$out/cudnn-device.json"
  else
    failures+=("GPU tests ($out/gpu-tests.log)")
    grep -E "FAILED|Failure" "$out/gpu-tests.log" | head -40 || true
    tail -20 "$out/gpu-tests.log"
  fi
fi

if runs table; then
  echo "== GEMM ceilings"
  if fits 30; then
    bounded "$kiln" bench gemm --device cuda --dtype bf16,fp8 $gemm_sizes | tee "$out/gemm.txt" ||
      failures+=("kiln bench gemm")
  else
    skip "kiln bench gemm"
  fi

  results=$out/results.jsonl
  : > "$results"
  # kiln in its fastest setting (above); then untuned (the verdict's fallback should the timing
  # fail), in bf16 on cuDNN's attention (the fastest without fp8: the fallback should fp8 fail on
  # this GPU), in bf16, with fp8 products alone, and with fp8 products and cuDNN's attention.
  # Against torch.compile (the speed issue's bar), and PyTorch eager with --eager (the CUDA back-end
  # issue's).
  others=("$untuned" "bf16 cudnn:--cudnn-attention" "bf16" "fp8:--fp8-format hybrid"
          "fp8 cudnn:--fp8-format hybrid --cudnn-attention")
  kiln_row() {  # kiln_row SHAPE SETTING
    local name micro switches=""
    read -r name _ _ _ micro <<< "$1"
    [[ $2 == *:* ]] && switches=${2#*:}
    measure "$results" "\"model\":\"$name\",\"who\":\"kiln\",\"setting\":\"${2%%:*}\",\"mb\":$micro" $reserve_kiln \
      "$kiln" bench train --device cuda --bf16 $(model_flags "$1") --vocab-size $vocab --skip-gemm-ceiling --json \
      $timing $datasheet $switches
  }
  peer_row() {  # peer_row SHAPE COMPILED
    local compile="" reserve=$reserve_eager
    [[ $2 == true ]] && compile=--compile reserve=$reserve_compile
    measure "$results" "\"model\":\"${1%% *}\",\"who\":\"pytorch\",\"compiled\":$2" $reserve \
      "${peer_gpt[@]}" $(model_flags "$1") --vocab-size $vocab --precision bf16 $compile $timing
  }
  # The verdict first: each size's torch.compile run and kiln's predicted-best setting, then the
  # other settings, one at a time over the sizes, so a deadline cuts the last settings, not
  # verdicts, and the fallback's rows come before the rest.
  for shape in "${shapes[@]}"; do
    echo "== ${shape%% *}: torch.compile and kiln ${fastest%%:*}"
    peer_row "$shape" true
    kiln_row "$shape" "$fastest"
  done
  for setting in "${others[@]}"; do
    echo "== kiln ${setting%%:*}"
    for shape in "${shapes[@]}"; do kiln_row "$shape" "$setting"; done
  done
  if ((eager)); then
    echo "== PyTorch eager"
    for shape in "${shapes[@]}"; do peer_row "$shape" false; done
  fi

  python3 - "$results" "$vocab" "${others[@]%%:*}" "${fastest%%:*}" <<'PY'
import json, math, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
vocab = int(sys.argv[2])
settings = sys.argv[3:]  # kiln's, in the order the table prints them
def done(row):
    return not row.get("failed") and not row.get("skipped")
def speed(row):
    if not done(row):
        return ("skipped" if row.get("skipped") else "failed", "", "", "")
    losses = row.get("losses") or [float("nan")]
    return (f"{row['tokens_per_second']:.0f}", f"{row['peak_memory_gib']:.1f}", f"{losses[-1]:.3f}",
            f"{row.get('wall_s', '')}")
def roofline(row):  # the measured step's share of its roofline (kiln bench train: perf/roofline.h)
    share = row.get("share_of_roofline", 0) if done(row) else 0
    return f"{100 * share:.0f}%" if share > 0 else "n/a"
def ratio(kiln, peer):
    if not (kiln and peer and done(kiln) and done(peer)):
        return ""
    return f"{kiln['tokens_per_second'] / peer['tokens_per_second']:.2f}"
def order(row):
    return (0, settings.index(row["setting"])) if row["who"] == "kiln" else (1, row["compiled"])
print()
print(f"(loss: the last step's; uniformly random tokens give about ln {vocab} = {math.log(vocab):.3f}; kiln bench"
      " train ends with an error where a run's losses leave ln V -0.25/+1.5)")
print(f"{'model':>6} {'mb':>3} {'who':>30} | {'tok/s':>9} {'GiB':>6} {'loss':>7} {'wall s':>6} {'of roofline':>11} |"
      f" {'vs eager':>8} {'vs compile':>10}")
for model in dict.fromkeys(r["model"] for r in rows):
    peers = {r["compiled"]: r for r in rows if r["model"] == model and r["who"] == "pytorch"}
    eager, compiled = peers.get(False), peers.get(True)
    for r in sorted((r for r in rows if r["model"] == model), key=order):
        who = f"kiln {r['setting']}" if r["who"] == "kiln" else ("torch.compile" if r["compiled"] else "torch eager")
        mb = r.get("mb", "")
        share = roofline(r) if r["who"] == "kiln" else ""
        ratios = (ratio(r, eager), ratio(r, compiled)) if r["who"] == "kiln" else ("", "")
        tokens, gib, loss, wall = speed(r)
        print(f"{model:>6} {mb:>3} {who:>30} | {tokens:>9} {gib:>6} {loss:>7} {wall:>6} {share:>11} |"
              f" {ratios[0]:>8} {ratios[1]:>10}")
# The speed issue's bar, per size: kiln's faster setting at 1.25x or more of PyTorch's faster run, at a
# peak below the lower of PyTorch's peaks.
print()
for model in dict.fromkeys(r["model"] for r in rows):
    kiln = [r for r in rows if r["model"] == model and r["who"] == "kiln" and done(r)]
    peers = [r for r in rows if r["model"] == model and r["who"] == "pytorch" and done(r)]
    if not kiln or not peers:
        print(f"{model}: no verdict (no kiln run or no PyTorch run finished)")
        continue
    best = max(kiln, key=lambda r: r["tokens_per_second"])
    peer = max(peers, key=lambda r: r["tokens_per_second"])
    speedup = best["tokens_per_second"] / peer["tokens_per_second"]
    peer_gib = min(r["peak_memory_gib"] for r in peers)
    setting, peer_name = best["setting"], ("torch.compile" if peer["compiled"] else "eager")
    print(f"{model}: kiln {setting} at {speedup:.2f}x PyTorch {peer_name}: "
          f"{'meets' if speedup >= 1.25 else 'short of'} 1.25x; peak {best['peak_memory_gib']:.1f} GiB, "
          f"{'below' if best['peak_memory_gib'] < peer_gib else 'not below'} PyTorch's {peer_gib:.1f}"
          f"{'' if speedup >= 1.25 else ' (where the time goes: --stages levers, profile*.txt)'}")
PY
fi

if runs levers; then
  read -r _ layers hidden heads micro <<< "$lever_shape"
  model=$(model_flags "$lever_shape")
  # First, where the time goes (--profile-ops, per op), before the deadline can cut it: the table's
  # fastest setting at 124M (profile-fastest.txt: what limits the verdict) and at 350M, the size
  # furthest from the bar on 2026-11-26 (profile-fastest-350M.txt); bf16 on kiln's attention
  # (profile.txt) and with fp8 products (profile-fp8.txt) at 124M.
  profile_iters=5
  [[ -n $timing ]] && profile_iters=1
  for profiled in "profile-fastest:$lever_shape:${fastest#*:}" "profile-fastest-350M:$lagging_shape:${fastest#*:}" \
                  "profile:$lever_shape:" "profile-fp8:$lever_shape:--fp8-format hybrid"; do
    IFS=: read -r name shape switch <<< "$profiled"
    if ! fits $reserve_kiln; then
      skip "kiln bench train ${shape%% *} --profile-ops $switch"
      continue
    fi
    echo "== time by op, ${shape%% *} micro-batch ${shape##* }${switch:+ $switch} (--profile-ops: a device wait after every op)"
    bounded "$kiln" bench train --device cuda --bf16 $(model_flags "$shape") --vocab-size $vocab --skip-gemm-ceiling \
      --warmup-iters 2 --timed-iters $profile_iters --profile-ops $datasheet $switch | tee "$out/$name.txt" ||
      failures+=("kiln bench train ${shape%% *} --profile-ops $switch")
  done
  echo "== levers on ${lever_shape%% *} micro-batch $micro (each row one kiln bench train; the first is the table's setting)"
  levers=$out/levers.jsonl
  : > "$levers"
  for switch in "" "--cuda-graph" "--no-fused-attention" "--warpgroup-attention" "--no-deterministic-attention" \
                "--no-matmul-epilogues" "--matmul-autotune" "--recompute-granularity selective" "--fp8-format hybrid" \
                "--fp8-format hybrid --no-fp8-fast-accumulation" "--fp8-format hybrid --cuda-graph" \
                "--fp8-format hybrid --matmul-autotune" "--fp8-format hybrid --fp8-classifier" \
                "--fp8-format hybrid --fp8-classifier --loss-chunk-rows 16384" "--loss-chunk-rows 16384" \
                "--cudnn-attention" "--cudnn-attention --cuda-graph"; do
    measure "$levers" "\"switch\":\"${switch:-(defaults)}\"" $reserve_kiln \
      "$kiln" bench train --device cuda --bf16 $model --vocab-size $vocab --skip-gemm-ceiling --json $timing $datasheet $switch
  done
  python3 - "$levers" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
print(f"{'switch':>46} {'ms/iter':>8} {'tok/s':>9} {'GiB':>6} {'roofline ms':>11}  back-end notes")
for r in rows:
    if r.get("failed") or r.get("skipped"):
        print(f"{r['switch']:>46} {'skipped' if r.get('skipped') else 'failed':>8}")
        continue
    print(f"{r['switch']:>46} {r['median_ms_per_iteration']:>8.1f} {r['tokens_per_second']:>9.0f}"
          f" {r['peak_memory_gib']:>6.1f} {r['roofline_ms_per_iteration']:>11.3g}  {r['backend_notes']}")
PY
  echo "== attention core alone, bf16 causal: kiln (fused: on mma.sync, the default, and on wgmma where it runs, each with" \
       "the backward deterministic and adding dQ atomically; materialised; on cuDNN) and PyTorch SDPA"
  attention=$out/attention.jsonl
  : > "$attention"
  for shape in "${attention_shapes[@]}"; do
    read -r batch heads size <<< "$shape"
    args="--batch $batch --seq-length $seq --num-attention-heads $heads --head-size $size"
    shape_fields="\"shape\":\"${batch}x$seq ${heads}x$size\""
    attention_timing=${timing:+--warmup 1 --iters 1}
    measure "$attention" "$shape_fields,\"row\":\"kiln fused\"" $reserve_attention \
      "$kiln" bench attention --device cuda $args --json $attention_timing
    measure "$attention" "$shape_fields,\"row\":\"kiln fused atomic dQ\"" $reserve_attention \
      "$kiln" bench attention --device cuda $args --no-deterministic-attention --json $attention_timing
    measure "$attention" "$shape_fields,\"row\":\"kiln fused wgmma\"" $reserve_attention \
      "$kiln" bench attention --device cuda $args --warpgroup-attention --json $attention_timing
    measure "$attention" "$shape_fields,\"row\":\"kiln wgmma atomic dQ\"" $reserve_attention \
      "$kiln" bench attention --device cuda $args --warpgroup-attention --no-deterministic-attention --json \
      $attention_timing
    measure "$attention" "$shape_fields,\"row\":\"kiln materialised\"" $reserve_attention \
      "$kiln" bench attention --device cuda $args --no-fused-attention --json $attention_timing
    measure "$attention" "$shape_fields,\"row\":\"kiln on cuDNN\"" $reserve_attention \
      "$kiln" bench attention --device cuda $args --cudnn-attention --json $attention_timing
    measure "$attention" "$shape_fields,\"row\":\"pytorch\"" $reserve_attention "${peer_attention[@]}" $args \
      $attention_timing
  done
  python3 - "$attention" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
print(f"{'shape':>22} {'who':>20} {'fwd ms':>8} {'TFLOP/s':>8} {'bwd ms':>8} {'TFLOP/s':>8}")
for r in rows:
    if r.get("failed") or r.get("skipped"):
        print(f"{r['shape']:>22} {r['row']:>20} {'skipped' if r.get('skipped') else 'failed':>8}")
        continue
    print(f"{r['shape']:>22} {r['row']:>20} {r['forward_ms']:>8.2f} {r['forward_tflops']:>8.1f} {r['backward_ms']:>8.2f}"
          f" {r['backward_tflops']:>8.1f}")
PY
fi

if runs counters; then
  # counters NAME NCU-OPTIONS... -- COMMAND...: ncu's report of COMMAND's kernels (those the options
  # pick) as $out/NAME.ncu-rep, its details as NAME.txt and NAME-details.csv, every metric as
  # NAME.csv, and one line per kernel here. The clocks are left as they are (METHOD.md).
  counters() {
    local name=$1 options=()
    shift
    while [[ $1 != -- ]]; do options+=("$1"); shift; done
    shift
    if ! fits $reserve_ncu; then
      skip "counters $name"
      return
    fi
    echo "== counters: $name"
    if bounded timeout 300 "${ncu[@]}" --clock-control none -f -o "$out/$name" "${options[@]}" "$@" > "$out/$name.log" 2>&1 &&
        "${ncu[@]}" --import "$out/$name.ncu-rep" > "$out/$name.txt" &&
        "${ncu[@]}" --import "$out/$name.ncu-rep" --csv --page details > "$out/$name-details.csv" &&
        "${ncu[@]}" --import "$out/$name.ncu-rep" --csv --page raw > "$out/$name.csv"; then
      python3 - "$out/$name-details.csv" "$out/$name.csv" <<'PY'
import collections, csv, re, sys
# One line per profiled kernel: the details page's metrics by their display names (blank where a
# section was not collected).
kernels = collections.OrderedDict()
for row in csv.DictReader(open(sys.argv[1])):
    kernel = kernels.setdefault(row["ID"], {"name": row["Kernel Name"], "grid": row.get("Grid Size", ""),
                                            "block": row.get("Block Size", "")})
    kernel[row["Metric Name"]] = (row["Metric Value"].replace(",", ""), row["Metric Unit"])
def microseconds(kernel):
    value, unit = kernel.get("Duration", ("", ""))
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(unit)
    return f"{float(value) * scale:.1f}" if value and scale else ""
def short(name):  # the function's own name, without namespaces, template arguments or parameters
    name = re.sub(r"\(.*$", "", re.sub(r"<.*>", "", name))
    return name.split("::")[-1].split(" ")[-1][:44]
def value(kernel, metric):
    return kernel.get(metric, ("", ""))[0]
percentages = ["Achieved Occupancy", "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput"]
if len(kernels) <= 40:
    print(f"{'kernel':>44} {'grid':>14} {'block':>12} {'us':>8} {'regs':>5} {'occup%':>7} {'SM%':>6} {'mem%':>6}"
          f" {'dram%':>6}")
    for kernel in kernels.values():
        print(f"{short(kernel['name']):>44} {kernel['grid']:>14} {kernel['block']:>12} {microseconds(kernel):>8}"
              f" {value(kernel, 'Registers Per Thread'):>5}" + "".join(f" {value(kernel, m):>6}" for m in percentages))
else:  # a step's hundreds of launches: by kernel, the 25 that took longest, percentages weighted by time
    by_name = collections.defaultdict(lambda: {"launches": 0, "us": 0.0, "weighted": [0.0] * len(percentages)})
    for kernel in kernels.values():
        us = float(microseconds(kernel) or 0)
        entry = by_name[short(kernel["name"])]
        entry["launches"] += 1
        entry["us"] += us
        for i, metric in enumerate(percentages):
            entry["weighted"][i] += us * float(value(kernel, metric) or 0)
    print(f"{len(kernels)} launches of {len(by_name)} kernels; the 25 that took longest:")
    print(f"{'kernel':>44} {'launches':>8} {'us':>9} {'occup%':>7} {'SM%':>6} {'mem%':>6} {'dram%':>6}")
    for name, entry in sorted(by_name.items(), key=lambda item: -item[1]["us"])[:25]:
        weights = [w / entry["us"] if entry["us"] > 0 else 0.0 for w in entry["weighted"]]
        print(f"{name:>44} {entry['launches']:>8} {entry['us']:>9.1f}" + "".join(f" {w:>6.1f}" for w in weights))
# Where the warps wait (section WarpStateStats, in --set full), for a few launches: the raw page's
# cycles stalled per issued instruction by reason, the largest four a launch (its rows after the
# header, but for the units row ncu puts first, whose ID is not a number).
rows = list(csv.reader(open(sys.argv[2]))) if len(kernels) <= 40 else []
stall = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
reasons = [(i, m.group(1)) for i, metric in enumerate(rows[0] if rows else []) if (m := stall.match(metric))]
if reasons:
    print("warp stalls, cycles per issued instruction (largest four):")
    name_at = rows[0].index("Kernel Name")
    for row in rows[1:]:
        if len(row) != len(rows[0]) or not row[0].strip().isdigit():
            continue
        cycles = sorted(((float(row[i].replace(",", "")), reason) for i, reason in reasons
                         if re.fullmatch(r"[0-9.]+", row[i].replace(",", ""))), reverse=True)[:4]
        print(f"{short(row[name_at]):>44}  " + ", ".join(f"{reason} {value:.2f}" for value, reason in cycles))
PY
    else
      failures+=("counters $name ($out/$name.log)")
      echo "FAILED: counters $name" >&2
      tail -5 "$out/$name.log" >&2
    fi
  }
  if [[ -z $rehearse ]] && ! command -v ncu > /dev/null; then
    failures+=("counters: ncu is not on the PATH")
  else
    # The attention core at the table's shape: kiln's fused kernels (deterministic, adding dQ
    # atomically, on wgmma), the kernels of PyTorch's SDPA and cuDNN's as kiln runs them, every
    # section (--set full). Five
    # launches: the warm-up and the timed forward, then the warm-up backward's kernels.
    read -r batch heads size <<< "${attention_shapes[0]}"
    args="--batch $batch --seq-length $seq --num-attention-heads $heads --head-size $size"
    attention_kernels='regex:forward_kernel|gradients_kernel|gradient_from_sums|row_dots'
    counters attention-kiln --set full -k "$attention_kernels" -c 5 -- \
      "$kiln" bench attention --device cuda $args --warmup 1 --iters 1
    counters attention-kiln-atomic-dq --set full -k "$attention_kernels" -c 5 -- \
      "$kiln" bench attention --device cuda $args --no-deterministic-attention --warmup 1 --iters 1
    counters attention-kiln-wgmma --set full -k "$attention_kernels" -c 5 -- \
      "$kiln" bench attention --device cuda $args --warpgroup-attention --warmup 1 --iters 1
    sdpa_kernels='regex:flash|fmha|attn|attention|sdpa|cudnn|mha|dot_do_o|convert_dq'
    counters attention-sdpa --set full -k "$sdpa_kernels" -c 10 -- "${peer_attention[@]}" $args --warmup 1 --iters 1
    # cuDNN's engines as kiln calls them: their kernel names beside SDPA's say whether SDPA ran them.
    counters attention-kiln-cudnn --set full -k "$sdpa_kernels" -c 10 -- \
      "$kiln" bench attention --device cuda $args --cudnn-attention --warmup 1 --iters 1
    # Every kernel of one training step of 124M's width with 2 layers, and the products PyTorch
    # eager runs for the same model (the same cuBLAS: do kiln's calls, epilogues included, match?).
    read -r _ layers hidden heads micro <<< "$lever_shape"
    step="--num-layers 2 --hidden-size $hidden --num-attention-heads $heads --seq-length $seq --micro-batch-size $micro"
    light=(--section SpeedOfLight --section LaunchStats --section Occupancy)
    for fp8 in "" "--fp8-format hybrid"; do
      counters "step-kiln${fp8:+-fp8}" "${light[@]}" -c 400 -- \
        "$kiln" bench train --device cuda --bf16 $step --vocab-size $vocab --skip-gemm-ceiling --warmup-iters 0 \
        --timed-iters 1 $datasheet $fp8
    done
    counters products-pytorch "${light[@]}" -k 'regex:gemm|nvjet|xmma|cutlass|sm90' -c 30 -- \
      "${peer_gpt[@]}" $step --vocab-size $vocab --precision bf16 --warmup-iters 1 --timed-iters 1
  fi
fi

if runs nccl; then
  echo "== NCCL, a group of one rank: kiln bench comm, then a GPT trained alone and launched over nccl (buckets," \
       "ZeRO-1): the same losses and gradient norms"
  if fits 60; then
    bounded "$kiln" launch --nproc-per-node 1 --standalone -- "$kiln" bench comm --distributed-backend nccl \
      $comm_sizes > "$out/bench-comm-nccl.txt" 2>&1 || failures+=("kiln bench comm over nccl ($out/bench-comm-nccl.txt)")
    cat "$out/bench-comm-nccl.txt"
    read -r layers hidden heads micro <<< "$nccl_shape"
    gpt=(--device cuda --bf16 --mock-data --vocab-size $vocab --num-layers $layers --hidden-size $hidden
         --num-attention-heads $heads --seq-length $seq --micro-batch-size $micro --global-batch-size $((2 * micro))
         --train-iters 8 --log-interval 1 --eval-iters 0 --ddp-bucket-size 1000000)
    for run in alone buckets zero1; do
      case $run in
        alone) command=("$kiln" train "${gpt[@]}") ;;
        buckets) command=("$kiln" launch --nproc-per-node 1 --standalone -- "$kiln" train "${gpt[@]}" \
                          --distributed-backend nccl) ;;
        *) command=("$kiln" launch --nproc-per-node 1 --standalone -- "$kiln" train "${gpt[@]}" \
                    --distributed-backend nccl --use-distributed-optimizer) ;;
      esac
      bounded "${command[@]}" > "$out/nccl-train-$run.log" 2>&1 || failures+=("nccl train $run ($out/nccl-train-$run.log)")
      # The iterations' loss and norm, without the timings
      grep -o "iteration *[0-9]*/.*lm loss: [^|]*\|grad norm: [^|]*" "$out/nccl-train-$run.log" |
        sed 's/iteration *\([0-9]*\)\/.*lm loss/\1 lm loss/' | paste -d' ' - - > "$out/nccl-train-$run.values" || true
    done
    for run in buckets zero1; do
      if [[ -s $out/nccl-train-alone.values ]] && cmp -s "$out/nccl-train-alone.values" "$out/nccl-train-$run.values"; then
        echo "nccl, one rank, $run: the same $(wc -l < "$out/nccl-train-$run.values") losses and norms as alone"
      else
        failures+=("nccl train $run differs from alone ($out/nccl-train-$run.values)")
        diff "$out/nccl-train-alone.values" "$out/nccl-train-$run.values" | head -6 >&2 || true
      fi
    done
  else
    skip "nccl"
  fi
fi

if runs loss; then
  loss_data=$(dirname "$kiln")/loss-data/sotu  # PREFIX of PREFIX_text_document.bin/.idx
  if [[ ! -f ${loss_data}_text_document.bin ]]; then
    scripts/prepare-loss-data.sh "$kiln" "$(dirname "$loss_data")" || true
  fi
  if [[ ! -f ${loss_data}_text_document.bin ]]; then
    failures+=("loss: no ${loss_data}_text_document.bin (scripts/pack-for-device.sh packs it)")
  else
    read -r layers hidden heads micro <<< "$loss_shape"
    echo "== loss curves, $layers x $hidden, $heads heads, sequence $seq, batch $micro, $loss_iters steps on the State" \
         "of the Union addresses: bf16, the fastest setting (${fastest%%:*}), bf16 perturbed, fp8 products, fp8" \
         "with the classifier's products too, bf16 on cuDNN's attention"
    for setting in bf16 fastest bf16-perturbed fp8 fp8-classifier bf16-cudnn; do
      case $setting in
        bf16) switch="" ;;
        fastest) switch=${fastest#*:} ;;
        bf16-perturbed) switch="--no-deterministic-attention" ;;
        fp8) switch="--fp8-format hybrid" ;;
        fp8-classifier) switch="--fp8-format hybrid --fp8-classifier" ;;
        *) switch="--cudnn-attention" ;;
      esac
      if ! fits $reserve_loss; then
        skip "loss $setting"
        continue
      fi
      if ! bounded "$kiln" train --device cuda --bf16 --data-path "${loss_data}_text_document" --vocab-size 50257 \
          --num-layers $layers --hidden-size $hidden --num-attention-heads $heads --seq-length $seq \
          --micro-batch-size $micro --global-batch-size $micro --train-iters $loss_iters --lr 6e-4 --min-lr 6e-5 \
          --lr-decay-style cosine --lr-warmup-iters $((loss_iters / 10)) --weight-decay 0.1 --clip-grad 1.0 \
          --seed 1234 $loss_logging $switch > "$out/loss-$setting.log" 2>&1; then
        failures+=("loss $setting ($out/loss-$setting.log)")
        echo "FAILED: loss $setting" >&2
        tail -5 "$out/loss-$setting.log" >&2
      fi
    done
    python3 - "$out" <<'PY'
import os, re, sys
# Each run's logged training losses (means over the log interval) and validation losses, from its log.
def curves(setting):
    path = os.path.join(sys.argv[1], f"loss-{setting}.log")
    train, validation = {}, []
    for line in open(path) if os.path.exists(path) else []:
        if m := re.search(r"iteration\s+(\d+)/.*\| lm loss: (\S+) \|", line):
            train[int(m.group(1))] = float(m.group(2))
        elif m := re.search(r"validation loss at .*\| lm loss value: (\S+) \|", line):
            validation.append(float(m.group(1)))
    return train, validation
settings = ["bf16", "fastest", "bf16-perturbed", "fp8", "fp8-classifier", "bf16-cudnn"]
runs = {s: curves(s) for s in settings}
reference_train, reference_validation = runs["bf16"]
print(f"{'setting':>26} {'first loss':>10} {'last loss':>10} {'validation':>10} {'largest gap':>11} {'at step':>7}"
      f" {'validation gap':>14}")
for setting in settings:
    train, validation = runs[setting]
    if not train:
        ran = os.path.exists(os.path.join(sys.argv[1], f"loss-{setting}.log"))
        print(f"{setting:>26} {'failed' if ran else 'skipped':>10}")
        continue
    steps = [step for step in train if step in reference_train]
    gaps = [(abs(train[step] - reference_train[step]), step) for step in steps]
    gap, at = max(gaps) if gaps else (float("nan"), 0)
    last_validation = validation[-1] if validation else float("nan")
    validation_gap = last_validation - reference_validation[-1] if validation and reference_validation else float("nan")
    print(f"{setting:>26} {train[min(train)]:>10.4f} {train[max(train)]:>10.4f} {last_validation:>10.4f} {gap:>11.4f}"
          f" {at:>7} {validation_gap:>+14.4f}")
print("(gaps against bf16's curve; bf16 perturbed shows how far runs drift that differ in rounding alone)")
PY
  fi
fi

if runs seedlab; then
  echo "== seed lab: kiln bench train --model encoder-classifier against PyTorch eager (bench/peers/pytorch_seed_lab.py)," \
       "fp32, TF32, fp16, bf16, each without and with per-block checkpointing, bf16 with 3 micro-batches accumulated"
  # The peer's Python: python3 where it has torch, else Debian's (a rehearsal's CPU peer).
  seedlab_python=""
  for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c 'import torch' 2> /dev/null; then seedlab_python=$(command -v "$candidate"); break; fi
  done
  if [[ -z $seedlab_python ]]; then
    failures+=("seedlab: neither python3 nor /usr/bin/python3 imports torch")
  elif ! fits 60; then
    skip "seedlab"
  else
    # seed_lab.py keeps the deadline itself (its rows start only if both runs fit, and a run still
    # going at the deadline is stopped), so that its table prints.
    python3 bench/seed_lab.py --kiln "$kiln" --python "$seedlab_python" $seedlab_options \
      --time-left $((deadline ? deadline - SECONDS : 0)) --out "$out" | tee "$out/seedlab.txt" ||
      failures+=("seedlab ($out/seedlab.jsonl, $out/seedlab-*.stderr)")
    if grep -q "skipped at the deadline" "$out/seedlab.txt"; then
      skipped+=("seedlab: $(sed -n 's/.*skipped at the deadline: //p' "$out/seedlab.txt")")
    fi
  fi
fi

if ((bundle)); then
  bundled=$(mktemp)
  (cd "$out" && find . -maxdepth 1 -type f ! -name '*.ncu-rep' ! -name device-check.tar.gz -printf '%P\n' | sort \
     > "$bundled" && tar -czf device-check.tar.gz -T "$bundled" && xargs rm -f < "$bundled") ||
    failures+=("bundling $out")
  rm -f "$bundled"
  echo "== bundled into $out/device-check.tar.gz: $(tar -tzf "$out/device-check.tar.gz" | tr '\n' ' ')"
  # The reports apart (they are large; the bundle has their text): two files in all.
  if compgen -G "$out/*.ncu-rep" > /dev/null; then
    (cd "$out" && tar -czf ncu-reports.tar.gz ./*.ncu-rep && rm -f ./*.ncu-rep) || failures+=("bundling the reports")
    echo "== reports in $out/ncu-reports.tar.gz"
  fi
fi

if ((${#skipped[@]})); then
  echo "== ${#skipped[@]} skipped, the deadline of $deadline s reached:"
  printf '  %s\n' "${skipped[@]}"
fi
if ((${#failures[@]})); then
  echo "== ${#failures[@]} failed:" >&2
  printf '  %s\n' "${failures[@]}" >&2
  exit 1
fi
