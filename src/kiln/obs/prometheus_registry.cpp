#include "kiln/obs/prometheus_registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string_view>

#include "kiln/core/error.h"

namespace kiln {
namespace {

// Metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]*
// (prometheus.io/docs/concepts/data_model/).
bool valid_name(std::string_view name, bool colon_allowed) {
  auto letter = [&](char c) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || (colon_allowed && c == ':');
  };
  return !name.empty() && letter(name[0]) && std::all_of(name.begin(), name.end(), [&](char c) {
    return letter(c) || std::isdigit(static_cast<unsigned char>(c));
  });
}

// Values and bounds as Go's ParseFloat reads them, with the format's spellings of the infinities.
std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

// HELP text escapes `\` and newline; label values also escape `"`.
std::string escaped(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '"' && quote)
      out += "\\\"";
    else
      out += c;
  }
  return out;
}

// `{a="1",b="2"}`, or "" for no labels.
std::string label_block(const PrometheusRegistry::Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (const auto& [name, value] : labels)
    out += fmt::format("{}{}=\"{}\"", out.size() > 1 ? "," : "", name, escaped(value, true));
  return out + "}";
}

const char* type_name(PrometheusRegistry::Type type) {
  switch (type) {
    case PrometheusRegistry::Type::counter:
      return "counter";
    case PrometheusRegistry::Type::gauge:
      return "gauge";
    case PrometheusRegistry::Type::histogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

PrometheusRegistry::PrometheusRegistry(Labels constant_labels)
    : constant_labels_(std::move(constant_labels)) {
  for (const auto& [name, value] : constant_labels_)
    KILN_CHECK(valid_name(name, false) && name != "le", "Prometheus label name '{}' is not valid",
               name);
}

PrometheusRegistry::Metric PrometheusRegistry::add_counter(std::string name, std::string help) {
  KILN_CHECK(name.ends_with("_total"), "Prometheus counter '{}' must end in _total", name);
  return add(std::move(name), std::move(help), Type::counter, {});
}

PrometheusRegistry::Metric PrometheusRegistry::add_gauge(std::string name, std::string help) {
  return add(std::move(name), std::move(help), Type::gauge, {});
}

PrometheusRegistry::Metric PrometheusRegistry::add_histogram(std::string name, std::string help,
                                                             std::vector<double> upper_bounds) {
  KILN_CHECK(
      !upper_bounds.empty() && std::is_sorted(upper_bounds.begin(), upper_bounds.end()) &&
          std::adjacent_find(upper_bounds.begin(), upper_bounds.end()) == upper_bounds.end() &&
          std::isfinite(upper_bounds.back()),
      "Prometheus histogram '{}': bucket bounds must be finite and increasing", name);
  return add(std::move(name), std::move(help), Type::histogram, std::move(upper_bounds));
}

PrometheusRegistry::Metric PrometheusRegistry::add(std::string name, std::string help, Type type,
                                                   std::vector<double> upper_bounds) {
  KILN_CHECK(valid_name(name, true), "Prometheus metric name '{}' is not valid", name);
  const std::lock_guard lock(mutex_);
  for (const Family& family : families_)
    KILN_CHECK(family.name != name, "Prometheus metric '{}' is added twice", name);
  families_.push_back({std::move(name), std::move(help), type, std::move(upper_bounds), {}});
  return {families_.size() - 1};
}

PrometheusRegistry::Sample& PrometheusRegistry::sample(Metric metric, Type expected,
                                                       const Labels& labels) {
  Family& family = families_.at(metric.index);
  KILN_CHECK(family.type == expected, "Prometheus metric '{}' is a {}, not a {}", family.name,
             type_name(family.type), type_name(expected));
  auto entry = family.samples.find(labels);
  if (entry == family.samples.end()) {  // a new label set: checked once
    for (const auto& [name, value] : labels)
      KILN_CHECK(valid_name(name, false) && name != "le",
                 "Prometheus metric '{}': label name '{}' is not valid", family.name, name);
    entry = family.samples.emplace(labels, Sample{}).first;
    if (expected == Type::histogram)
      entry->second.bucket_counts.resize(family.upper_bounds.size() + 1);
  }
  return entry->second;
}

void PrometheusRegistry::set(Metric gauge_or_counter, double value, const Labels& labels) {
  const std::lock_guard lock(mutex_);
  const Type type = families_.at(gauge_or_counter.index).type;
  sample(gauge_or_counter, type == Type::counter ? Type::counter : Type::gauge, labels).value =
      value;
}

void PrometheusRegistry::increment(Metric counter, double amount, const Labels& labels) {
  const std::lock_guard lock(mutex_);
  KILN_CHECK(amount >= 0, "Prometheus counter '{}' cannot decrease (by {})",
             families_.at(counter.index).name, amount);
  sample(counter, Type::counter, labels).value += amount;
}

void PrometheusRegistry::observe(Metric histogram, double value, const Labels& labels) {
  const std::lock_guard lock(mutex_);
  const std::vector<double>& bounds = families_.at(histogram.index).upper_bounds;
  Sample& entry = sample(histogram, Type::histogram, labels);
  const auto bucket =
      std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin();  // le is inclusive
  ++entry.bucket_counts[static_cast<size_t>(bucket)];
  entry.sum += value;
  ++entry.count;
}

std::string PrometheusRegistry::render() const {
  std::vector<Family> families;
  {
    const std::lock_guard lock(mutex_);
    families = families_;
  }
  std::string out;
  for (const Family& family : families) {
    if (family.samples.empty()) continue;
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", family.name, escaped(family.help, false),
                       family.name, type_name(family.type));
    for (const auto& [own_labels, sample] : family.samples) {
      Labels labels = constant_labels_;
      labels.insert(labels.end(), own_labels.begin(), own_labels.end());
      if (family.type != Type::histogram) {
        out +=
            fmt::format("{}{} {}\n", family.name, label_block(labels), format_value(sample.value));
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t bucket = 0; bucket < sample.bucket_counts.size(); ++bucket) {
        cumulative += sample.bucket_counts[bucket];
        Labels with_bound = labels;
        with_bound.emplace_back(
            "le", format_value(bucket < family.upper_bounds.size() ? family.upper_bounds[bucket]
                                                                   : INFINITY));
        out += fmt::format("{}_bucket{} {}\n", family.name, label_block(with_bound), cumulative);
      }
      out +=
          fmt::format("{}_sum{} {}\n", family.name, label_block(labels), format_value(sample.sum));
      out += fmt::format("{}_count{} {}\n", family.name, label_block(labels), sample.count);
    }
  }
  return out;
}

}  // namespace kiln
