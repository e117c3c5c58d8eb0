// The target value no loss counts, PyTorch's ignore_index default (-100): a data source marks with
// it the samples that only pad a batch (data/token_source.h), and the models leave such targets
// out of their mean loss, its gradient and a classifier's counted predictions (nn/model.h).
#pragma once

#include <cstdint>

namespace kiln {

inline constexpr int32_t kUncountedTarget = -100;

}  // namespace kiln
