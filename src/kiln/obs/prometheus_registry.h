// PrometheusRegistry: metric families and their current values, rendered in Prometheus's text
// exposition format 0.0.4 (prometheus.io/docs/instrumenting/exposition_formats/):
//
//   # HELP kiln_iterations_total Iterations completed.
//   # TYPE kiln_iterations_total counter
//   kiln_iterations_total{rank="0",host="node1"} 120
//
// Families render in the order they were added, each with its HELP and TYPE lines, then one line
// per label set (sorted); a histogram renders cumulative `<name>_bucket{...,le="<bound>"}` lines up
// to le="+Inf", then `<name>_sum` and `<name>_count`. A family without values renders nothing.
// Every sample carries the registry's constant labels first (rank, host), then its own (gpu).
//
// Names follow Prometheus's conventions: counters end in `_total`, units are base units in the
// name (`_seconds`, `_bytes`). Adding a family with an invalid name, or updating one with a call of
// the wrong type, is a kiln::Error naming the metric.
//
// Thread-safe: every call takes one mutex for as long as it copies numbers (render() copies the
// values, then formats without it), so the training thread never waits on a scrape for long.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

class PrometheusRegistry {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;  // (name, value), in this order
  enum class Type { counter, gauge, histogram };
  struct Metric {
    size_t index;  // a family this registry added
  };

  explicit PrometheusRegistry(Labels constant_labels = {});

  Metric add_counter(std::string name, std::string help);
  Metric add_gauge(std::string name, std::string help);
  // `upper_bounds`: the buckets' inclusive upper bounds, increasing; +Inf is added.
  Metric add_histogram(std::string name, std::string help, std::vector<double> upper_bounds);

  // A gauge's value, or a counter's when it mirrors a count kept elsewhere (never decreasing).
  void set(Metric gauge_or_counter, double value, const Labels& labels = {});
  void increment(Metric counter, double amount, const Labels& labels = {});  // amount >= 0
  void observe(Metric histogram, double value, const Labels& labels = {});

  std::string render() const;

 private:
  struct Sample {
    double value = 0;  // counter, gauge
    std::vector<uint64_t>
        bucket_counts;  // histogram: observations per bucket (not cumulative), +Inf last
    double sum = 0;
    uint64_t count = 0;
  };
  struct Family {
    std::string name, help;
    Type type;
    std::vector<double> upper_bounds;  // histogram
    std::map<Labels, Sample> samples;
  };

  Metric add(std::string name, std::string help, Type type, std::vector<double> upper_bounds);
  Sample& sample(Metric metric, Type expected, const Labels& labels);  // under mutex_

  Labels constant_labels_;
  mutable std::mutex mutex_;
  std::vector<Family> families_;
};

}  // namespace kiln
