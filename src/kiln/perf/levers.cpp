#include "kiln/perf/levers.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "kiln/core/error.h"
#include "kiln/train/model_kinds.h"

namespace kiln {

std::vector<LeverEstimate> estimate_levers(const EstimateInput& in) {
  std::vector<LeverEstimate> levers;
  levers.push_back({"(as given)", estimate(in), ""});
  const auto add = [&](const std::string& change,
                       const std::function<void(EstimateInput&)>& apply) {
    EstimateInput changed = in;
    apply(changed);
    try {
      levers.push_back({change, estimate(changed), ""});
    } catch (const Error& error) {
      levers.push_back({change, std::nullopt, error.what()});
    }
  };

  const RecomputeGranularity granularity = in.recompute.granularity;
  if (granularity != RecomputeGranularity::None)
    add("--recompute-granularity none", [](EstimateInput& e) { e.recompute = {}; });
  if (granularity != RecomputeGranularity::Selective)
    add("--recompute-granularity selective",
        [](EstimateInput& e) { e.recompute = RecomputePolicy::parse("selective", "", 1); });
  if (granularity != RecomputeGranularity::Full)
    add("--recompute-granularity full --recompute-method uniform",
        [](EstimateInput& e) { e.recompute = RecomputePolicy::parse("full", "uniform", 1); });

  const bool mixed = in.precision == "bf16" || in.precision == "fp16";
  if (mixed)
    add(in.fp8_format.empty() ? "--precision tf32" : "--precision tf32 (no fp8)",
        [](EstimateInput& e) {
          e.precision = "tf32";
          e.fp8_format.clear();
          e.fp8_classifier = false;
        });
  else
    add("--precision bf16", [](EstimateInput& e) { e.precision = "bf16"; });
  if (in.fp8_format.empty())
    add(in.precision == "bf16" ? "--fp8-format hybrid" : "--precision bf16 --fp8-format hybrid",
        [](EstimateInput& e) {
          e.precision = "bf16";
          e.fp8_format = "hybrid";
        });
  else
    add("no --fp8-format", [](EstimateInput& e) {
      e.fp8_format.clear();
      e.fp8_classifier = false;
    });
  const bool tied_classifier = model_kind(in.model).input == ModelInput::NextTokens;  // GPT's, which fp8 may run
  if (!in.fp8_format.empty() && tied_classifier)  // the classifier's products in fp8 too, or not
    add(in.fp8_classifier ? "no --fp8-classifier" : "--fp8-classifier",
        [](EstimateInput& e) { e.fp8_classifier = !e.fp8_classifier; });

  // The classifier and loss on 4 times the positions at a time (up to a micro-batch's): fewer,
  // larger products and fewer passes over wte's gradient, for more logits in memory. Only a model
  // whose loss runs over every position (next tokens) chunks it.
  const int64_t positions = in.micro_batch_size * in.seq_length;
  if (tied_classifier && positions > in.loss_chunk_rows) {
    const int64_t rows = std::min(positions, 4 * in.loss_chunk_rows);
    add(fmt::format("--loss-chunk-rows {}", rows), [rows](EstimateInput& e) { e.loss_chunk_rows = rows; });
  }

  const int64_t micro = in.micro_batch_size;
  if (micro % 2 == 0)
    add(fmt::format("--micro-batch-size {}", micro / 2),
        [&](EstimateInput& e) { e.micro_batch_size = micro / 2; });
  add(fmt::format("--micro-batch-size {}", 2 * micro),
      [&](EstimateInput& e) { e.micro_batch_size = 2 * micro; });

  if (in.gpus > 1)
    for (int stage = 0; stage <= 3; ++stage)
      if (stage != in.zero_stage)
        add(fmt::format("--zero-stage {}", stage),
            [stage](EstimateInput& e) { e.zero_stage = stage; });
  return levers;
}

}  // namespace kiln
