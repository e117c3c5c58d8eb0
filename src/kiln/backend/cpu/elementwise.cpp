// Fill (any floating dtype, written directly) and dtype conversion, to fp8 codes too.
#include "kiln/backend/op_checks.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/fp8_cast.h"

namespace kiln {

void CpuBackend::zero_to_write(GradStore store, std::initializer_list<Tensor> grads) {
  if (store != GradStore::Write) return;
  for (const Tensor& grad : grads)
    if (!grad.empty()) fill({grad, 0.0f});
}

void CpuBackend::fill(const Fill& args) {
  const int64_t count = checks::fill(args, Device::CPU);
  if (args.out.dtype == DType::F32) {
    float* out = args.out.as<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) out[i] = args.value;
    return;
  }
  const uint16_t bits = args.out.dtype == DType::BF16 ? float_to_bf16(args.value) : float_to_fp16(args.value);
  uint16_t* out = args.out.as<uint16_t>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = bits;
}

void CpuBackend::convert(const Convert& args) {
  const int64_t count = checks::convert(args, Device::CPU);
  if (args.fp8) {  // to fp8 codes (ops.h): the values widened exactly, then cast as a product would
    scratch_.reset();
    const Tensor values{scratch_.take(static_cast<size_t>(count)), args.in.shape, DType::F32, Device::CPU};
    widen_to_fp32(args.in.data, args.in.dtype, values.as<float>(), count);
    cast_output_to_fp8(values, args.in.dtype, *args.fp8, DType::F8E4M3, args.out, args.out_t, scratch_);
    return;
  }
  const DType from = args.in.dtype, to = args.out.dtype;
  if (from == to) {
    copy_to_device(args.out.data, args.in.data, args.in.bytes());
  } else if (to == DType::F32) {
    widen_to_fp32(args.in.data, from, args.out.as<float>(), count);
  } else {  // from fp32, or between bf16 and fp16 through fp32
    Fp32Scope f(scratch_);
    narrow_from_fp32(f.input(args.in).as<float>(), to, args.out.data, count);
  }
}

}  // namespace kiln
