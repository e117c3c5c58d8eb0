#include "kiln/obs/run_report_measured.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <vector>

namespace kiln {
namespace {

// The mean of the finite values after the first point (or of the one point); nullopt for none.
std::optional<double> mean_after_warm_up(const std::vector<ScalarPoint>& points) {
  double sum = 0;
  int64_t count = 0;
  for (size_t i = points.size() > 1 ? 1 : 0; i < points.size(); ++i)
    if (std::isfinite(points[i].value)) {
      sum += points[i].value;
      ++count;
    }
  if (count == 0) return std::nullopt;
  return sum / static_cast<double>(count);
}

std::optional<double> largest(const std::vector<ScalarPoint>& points) {
  if (points.empty()) return std::nullopt;
  return std::max_element(points.begin(), points.end(),
                          [](const ScalarPoint& a, const ScalarPoint& b) { return a.value < b.value; })
      ->value;
}

std::optional<ScalarPoint> last_of(const std::vector<ScalarPoint>& points) {
  if (points.empty()) return std::nullopt;
  return points.back();
}

}  // namespace

RunMeasured measure_run(const RunHistory& history, int64_t tokens_per_iteration) {
  RunMeasured measured;
  const std::vector<ScalarPoint>& loss = history.scalar("lm loss");
  if (!loss.empty()) measured.first_loss = loss.front();
  measured.last_loss = last_of(loss);
  measured.last_validation_loss = last_of(history.scalar("lm loss validation"));
  if (const auto samples = last_of(history.scalar("lm loss vs samples"))) measured.samples = samples->step;
  measured.seconds_per_iteration = mean_after_warm_up(history.scalar("iteration-time"));
  measured.tflops_per_gpu = mean_after_warm_up(history.scalar("throughput"));
  if (tokens_per_iteration > 0 && measured.seconds_per_iteration && *measured.seconds_per_iteration > 0)
    measured.tokens_per_second = static_cast<double>(tokens_per_iteration) / *measured.seconds_per_iteration;
  measured.peak_memory_bytes = largest(history.scalar("mem-max-allocated-bytes"));
  measured.peak_device_memory_bytes = largest(history.scalar("mem-reserved-bytes"));
  return measured;
}

}  // namespace kiln
