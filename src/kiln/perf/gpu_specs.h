// Datasheet numbers of common training GPUs: dense (no sparsity) peak TFLOP/s per precision,
// memory and bandwidth. Sources, NVIDIA's product datasheets:
//   H100 SXM5 / PCIe: "NVIDIA H100 Tensor Core GPU" datasheet (2023); tensor figures there are
//     quoted with sparsity, halved here.
//   H200 SXM: "NVIDIA H200 Tensor Core GPU" datasheet (2024), same compute as H100 SXM.
//   A100 40/80 GB: "NVIDIA A100 Tensor Core GPU" datasheet (2021).
//   L40S: "NVIDIA L40S" datasheet (2023).   V100 SXM2: "NVIDIA Tesla V100" datasheet (2020).
//   A10: "NVIDIA A10 Tensor Core GPU" datasheet (2021). AWS's A10G variant is not listed: NVIDIA
//     publishes no datasheet for it and its tensor throughput differs from the A10's.
// 0 means the precision is not supported by that GPU's tensor cores.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

struct GpuSpec {
  std::string key;          // --gpu value, e.g. "h100-sxm"
  std::string marketing;    // what cudaGetDeviceProperties().name contains, e.g. "H100 80GB HBM3"
  double fp32_tflops = 0, tf32_tflops = 0, bf16_tflops = 0, fp16_tflops = 0, fp8_tflops = 0;
  double memory_gib = 0, bandwidth_tb_per_s = 0;

  // Peak for a kiln precision name: "fp32", "tf32", "bf16", "fp16", "fp8".
  double peak_tflops(std::string_view precision) const;
};

const std::vector<GpuSpec>& gpu_specs();
std::optional<GpuSpec> find_gpu_by_key(std::string_view key);
// Matches a CUDA device name ("NVIDIA H100 80GB HBM3") to the table.
std::optional<GpuSpec> find_gpu_by_device_name(std::string_view device_name);

}  // namespace kiln
