#!/usr/bin/env bash
# Compiles CUDA kernel files for sm_90a with ptxas's report (-Xptxas -v) and fails when ptxas says
# a kernel spills registers to local memory, or reports anything about its wgmma instructions
# (advisories C751x: "Potential Performance Loss ... serialized" when an instruction touches a
# wgmma's accumulator or A registers while it is in flight, C7519 when ptxas injects warpgroup
# fences to fit registers around them). Each leaves a kernel correct and slower, so no other test
# would notice; the attention kernels' speed depends on none happening (bench/NOTES.md).
#
# usage: check_ptxas_report.sh [--allow REGEX=BYTES]... NVCC SOURCE_ROOT FILE.cu...
#   FILE relative to SOURCE_ROOT; --allow: functions whose (mangled) name matches REGEX may spill up
#   to BYTES in stores and in loads (a known spill the caller documents).
set -euo pipefail

allowed=()
while [[ ${1:-} == --allow ]]; do
  allowed+=("$2")
  shift 2
done
nvcc=$1 root=$2
shift 2
status=0
for file in "$@"; do
  report=$("$nvcc" -std=c++17 -O3 -DNDEBUG --extended-lambda -DKILN_CUDA_WGMMA=1 -I"$root/src" \
    --generate-code=arch=compute_90a,code=sm_90a -cubin -o /dev/null -Xptxas -v "$root/$file" 2>&1) || {
    echo "$file: nvcc failed"
    echo "$report"
    exit 1
  }
  kernels=$(grep -c "Compiling entry function" <<<"$report" || true)
  if [[ $kernels -eq 0 ]]; then
    echo "$file: ptxas reported no kernels (was -Xptxas -v honoured?)"
    status=1
    continue
  fi
  advisories=$(grep -E "\(C751[0-9]\)" <<<"$report" || true)
  # ptxas: "Function properties for NAME", then "S bytes stack frame, X bytes spill stores, Y bytes
  # spill loads"; the functions with X or Y above 0.
  spilled=$(awk -v allowed="${allowed[*]}" '
    /Function properties for/ {name = $NF}
    /bytes spill stores/ {
      stores = $(NF - 7); loads = $(NF - 3)  # "... X bytes spill stores, Y bytes spill loads"
      if (stores == 0 && loads == 0) next
      n = split(allowed, rules, " ")
      for (i = 1; i <= n; ++i) {
        split(rules[i], rule, "=")
        if (name ~ rule[1] && stores <= rule[2] && loads <= rule[2]) next
      }
      print name ": " $0
    }' <<<"$report")
  if [[ -n $advisories ]]; then
    echo "$file: ptxas reports on wgmma instructions:"
    echo "$advisories"
    status=1
  fi
  if [[ -n $spilled ]]; then
    echo "$file: ptxas spilled registers:"
    echo "$spilled"
    status=1
  fi
  if [[ -z $advisories && -z $spilled ]]; then
    echo "$file: $kernels kernels, no spills (beyond those allowed), no wgmma advisories"
  fi
done
exit $status
