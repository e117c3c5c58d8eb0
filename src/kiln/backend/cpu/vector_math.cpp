#include "kiln/backend/cpu/vector_math.h"

namespace kiln {

KILN_VECTOR_CLONES void exp_shifted_in_place(float* values, int64_t count, float shift) {
  for (int64_t i = 0; i < count; ++i) values[i] = exp_vectorizable(values[i] - shift);
}

}  // namespace kiln
