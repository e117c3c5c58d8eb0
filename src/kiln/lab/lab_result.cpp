#include "kiln/lab/lab_result.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace kiln {
namespace {

std::string settings_text(const LabRowResult& row) {
  std::string text;
  for (const auto& [key, value] : row.settings) text += fmt::format("{}{}={}", text.empty() ? "" : " ", key, value);
  return text.empty() ? "(the base configuration)" : text;
}

}  // namespace

std::string lab_table(const LabResults& results) {
  std::string out = fmt::format("# kiln lab | {} | {} | medians of {} iterations after {} warm-up\n", results.model,
                                results.machine, results.timed_iters, results.warmup_iters);
  for (const LabExperiment& lab : results.labs) {
    out += fmt::format("\n## lab {}: {} ({})\n", lab.number, lab.title, lab.question);
    if (!lab.unavailable.empty()) {
      out += fmt::format("   not run: {}\n", lab.unavailable);
      continue;
    }
    out += fmt::format("   {:<40} {:>10} {:>10} {:>10} {:>10} {:>8}\n", "setting", "samples/s", "step ms", "peak MiB",
                       "data wait", "ratio");
    for (const LabRowResult& row : lab.rows) {
      std::string name = row.baseline ? row.name + " (baseline)" : row.name;
      if (row.ranks > 1 && name.find("rank") == std::string::npos) name += fmt::format(", {} ranks", row.ranks);
      if (!row.measured) {
        out += fmt::format("   {:<40} not run: {}\n", name, row.unavailable);
        continue;
      }
      if (name.size() > 40) {  // a long name on a line of its own, the numbers under it
        out += fmt::format("   {}\n", name);
        name.clear();
      }
      const LabMeasurement& m = *row.measured;
      out += fmt::format("   {:<40} {:>10.1f} {:>10.1f} {:>10.1f} {:>9.1f}% {:>7.2f}x\n", name, m.samples_per_second,
                         m.step_ms, static_cast<double>(m.peak_memory_bytes) / 1048576.0, 100.0 * m.data_wait_share,
                         m.ratio);
    }
  }
  return out;
}

std::string lab_json(const LabResults& results) {
  nlohmann::json labs = nlohmann::json::array();
  for (const LabExperiment& lab : results.labs) {
    nlohmann::json rows = nlohmann::json::array();
    for (const LabRowResult& row : lab.rows) {
      nlohmann::json settings = nlohmann::json::object();
      for (const auto& [key, value] : row.settings) settings[key] = value;
      nlohmann::json entry = {{"name", row.name}, {"settings", settings}, {"settings_text", settings_text(row)},
                              {"ranks", row.ranks}, {"baseline", row.baseline}, {"ran", row.measured.has_value()}};
      if (row.measured) {
        const LabMeasurement& m = *row.measured;
        entry.update({{"samples_per_second", m.samples_per_second}, {"step_ms", m.step_ms},
                      {"peak_memory_bytes", m.peak_memory_bytes}, {"data_wait_share", m.data_wait_share},
                      {"ratio", m.ratio}, {"final_loss", m.final_loss}});
      } else {
        entry["unavailable"] = row.unavailable;
      }
      rows.push_back(entry);
    }
    nlohmann::json entry = {{"lab", lab.number}, {"title", lab.title}, {"question", lab.question}, {"rows", rows}};
    if (!lab.unavailable.empty()) entry["unavailable"] = lab.unavailable;
    labs.push_back(entry);
  }
  return nlohmann::json{{"model", results.model},
                        {"machine", results.machine},
                        {"warmup_iters", results.warmup_iters},
                        {"timed_iters", results.timed_iters},
                        {"labs", labs}}
      .dump(2);
}

}  // namespace kiln
