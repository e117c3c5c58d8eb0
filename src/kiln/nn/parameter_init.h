// A model's initial parameters, drawn the same way for every model.
//
// Each tensor of a ParameterLayout starts either at a constant (LayerNorm gains 1, biases 0) or
// at draws of N(0, stddev^2), from a stream of its own: the Philox generator (core/philox.h) keyed
// by the seed, on the stream named by the tensor's name (hash_string). Element i is the i-th
// normal of that stream (Box-Muller: block i / 4's words 0-1 give elements 4k and 4k+1, words 2-3
// elements 4k+2 and 4k+3). So a tensor's initial values depend on the seed, its name and its rule
// only: not on which other tensors the model has or where they lie (a model that gains a tensor
// keeps every other tensor's draws), and not on how many threads draw them (OpenMP, over chunks
// of the buffer).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/nn/parameters.h"

namespace kiln {

// How one tensor starts: its first `drawn` elements (all, when negative) from N(0, stddev^2) when
// stddev > 0, and every other element at `constant`.
struct InitialValues {
  float constant = 0.0f;
  float stddev = 0.0f;
  int64_t drawn = -1;
};

using InitialValuesOf = std::function<InitialValues(const ParameterInfo&)>;

// The whole flat buffer's initial values in fp32, laid out by `layout`.
std::vector<float> initial_parameters(const ParameterLayout& layout, uint64_t seed, const InitialValuesOf& rule);

}  // namespace kiln
