#!/usr/bin/env bash
# For the lent GPU machine (Ubuntu 24.04 with CUDA 13 and the NVIDIA driver, but none of kiln's
# -dev packages, and nothing can be installed there): builds kiln with CUDA for sm_90a (Release)
# in build-device/ and packs build-pack/ to carry there: kiln, kiln_tests and libs.tar.xz with
# every shared library they load except the C runtime, libstdc++/libgcc (the device's are newer),
# cuBLAS (the device's CUDA toolkit has it), NCCL (200 MB; PyTorch's wheel has it there:
# device-check.sh finds it) and the driver's; and loss-data/, the text the loss
# stage trains on, tokenized.
#
#   scripts/pack-for-device.sh            here; then carry build-pack/ to the device and run
#   bench/device-check.sh --prebuilt      there (unpacks the libraries, uses build-pack/kiln*)
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
cmake --build build-device -j "$(nproc)" --target kiln kiln_tests  # not the emulator: the device runs the real thing
rm -rf build-pack
mkdir -p build-pack/lib
cp build-device/kiln build-device/kiln_tests build-pack/
ldd build-device/kiln build-device/kiln_tests | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | libresolv.so* | ld-linux* | libstdc++.so* | \
      libgcc_s.so* | libcuda.so* | libcublas* | libnccl* | libnvidia*) ;;
    *) cp -L "$lib" build-pack/lib/ ;;
  esac
done
tar -cJf build-pack/libs.tar.xz -C build-pack/lib .
rm -rf build-pack/lib
# The loss stage's text (device-check.sh), tokenized here: the device has neither npm nor its packages.
scripts/prepare-loss-data.sh build-device/kiln build-pack/loss-data ||
  echo "pack-for-device.sh: the loss stage will have no data" >&2
du -sh build-pack/*
