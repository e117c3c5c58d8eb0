// Stands in for CUB's DeviceRadixSort in the CPU emulator (cuda_emulator.h): SortPairs with CUB's
// contract as kiln uses it (a size query with a null workspace, then a stable ascending sort of
// integer keys, carrying their values, on `stream` as the emulator's streams run work), on host
// memory. The query answers a workspace size of its own, so a caller that does not pass what the
// query answered is caught. Keys are compared whole: kiln sorts all their bits.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

#include "cuda_emulator.h"

namespace cub {

struct DeviceRadixSort {
  template <typename Key, typename Value>
  static cudaError_t SortPairs(void* workspace, size_t& workspace_bytes, const Key* keys_in,
                               Key* keys_out, const Value* values_in, Value* values_out, int count,
                               int begin_bit = 0, int end_bit = static_cast<int>(sizeof(Key) * 8),
                               cudaStream_t stream = nullptr) {
    const size_t needed = 64 + static_cast<size_t>(count) * 2 * (sizeof(Key) + sizeof(Value));
    if (workspace == nullptr) {
      workspace_bytes = needed;
      return cudaSuccess;
    }
    if (workspace_bytes < needed || begin_bit != 0 || end_bit != static_cast<int>(sizeof(Key) * 8))
      return cudaErrorInvalidValue;
    cuda_emulator::submit(stream, [=] {
      std::vector<int> order(static_cast<size_t>(count));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return keys_in[a] < keys_in[b]; });
      std::vector<Key> keys(static_cast<size_t>(count));
      std::vector<Value> values(static_cast<size_t>(count));
      for (size_t i = 0; i < order.size(); ++i) {
        keys[i] = keys_in[order[i]];
        values[i] = values_in[order[i]];
      }
      std::copy(keys.begin(), keys.end(), keys_out);
      std::copy(values.begin(), values.end(), values_out);
    });
    return cudaSuccess;
  }
};

}  // namespace cub
