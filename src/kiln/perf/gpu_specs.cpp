#include "kiln/perf/gpu_specs.h"

namespace kiln {

double GpuSpec::peak_tflops(std::string_view precision) const {
  if (precision == "fp32") return fp32_tflops;
  if (precision == "tf32") return tf32_tflops;
  if (precision == "bf16") return bf16_tflops;
  if (precision == "fp16") return fp16_tflops;
  if (precision == "fp8") return fp8_tflops;
  return 0;
}

const std::vector<GpuSpec>& gpu_specs() {
  // key, device-name fragment, fp32, tf32, bf16, fp16, fp8, memory GiB, TB/s
  static const std::vector<GpuSpec> specs = {
      {"h100-sxm", "H100 80GB HBM3", 66.9, 494.7, 989.4, 989.4, 1978.9, 80, 3.35},
      {"h100-pcie", "H100 PCIe", 51.2, 378.0, 756.0, 756.0, 1513.0, 80, 2.0},
      {"h200", "H200", 66.9, 494.7, 989.4, 989.4, 1978.9, 141, 4.8},
      {"a100-80gb", "A100-SXM4-80GB", 19.5, 156.0, 312.0, 312.0, 0, 80, 2.039},
      {"a100-40gb", "A100-SXM4-40GB", 19.5, 156.0, 312.0, 312.0, 0, 40, 1.555},
      {"l40s", "L40S", 91.6, 183.0, 362.05, 362.05, 733.0, 48, 0.864},
      {"a10", "A10", 31.2, 62.5, 125.0, 125.0, 0, 24, 0.6},
      {"v100", "V100", 15.7, 0, 0, 125.0, 0, 32, 0.9},
  };
  return specs;
}

std::optional<GpuSpec> find_gpu_by_key(std::string_view key) {
  for (const GpuSpec& spec : gpu_specs())
    if (spec.key == key) return spec;
  return std::nullopt;
}

std::optional<GpuSpec> find_gpu_by_device_name(std::string_view device_name) {
  for (const GpuSpec& spec : gpu_specs())
    if (device_name.find(spec.marketing) != std::string_view::npos) return spec;
  return std::nullopt;
}

}  // namespace kiln
