// Which keys a query sees, for the fused attention kernels (flash_forward.cu, flash_backward.cu,
// general_attention.cu): the mask semantics of backend/ops.h. Device code only.
#pragma once

#include <cstdint>

namespace kiln::cuda {

struct Visibility {
  int length;               // T
  bool causal;
  const int32_t* key_mask;  // this sequence's [T] (1 keep, 0 pad), or null
  // Whether query `query` sees key `key`; false when either is outside [0, T).
  __device__ bool operator()(int query, int key) const {
    return query < length && key < length && (!causal || key <= query) && (key_mask == nullptr || key_mask[key] != 0);
  }
};

}  // namespace kiln::cuda
