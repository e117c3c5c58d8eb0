#include "kiln/lab/lab_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "kiln/core/error.h"
#include "kiln/storage/s3_client.h"
#include "kiln/train/model_kinds.h"
#include "kiln/train/trainer.h"

namespace kiln {
namespace {

using Settings = std::vector<std::pair<std::string, std::string>>;

LabRowResult row(std::string name, Settings settings, std::string unavailable = "", int ranks = 1) {
  LabRowResult result;
  result.name = std::move(name);
  result.settings = std::move(settings);
  result.unavailable = std::move(unavailable);
  result.ranks = ranks;
  return result;
}

std::string cuda_only(const LabMachine& machine, const std::string& what) {
  return machine.cuda ? "" : fmt::format("{} is a GPU matter; the base configuration runs on the CPU", what);
}

const char* on_off(bool on) { return on ? "true" : "false"; }

LabExperiment data_preloading(const LabMachine& machine) {
  LabExperiment lab{1, "Data pre-loading", "what loader workers, pinned memory, prefetch, the copy stream and the "
                                            "sample cache buy", {}, ""};
  for (const int workers : {0, 2, 4, 8})
    for (const bool pinned : {false, true})
      lab.rows.push_back(row(fmt::format("workers {}, pinned {}", workers, pinned ? "on" : "off"),
                             {{"num_workers", std::to_string(workers)}, {"pin_memory", on_off(pinned)}},
                             pinned ? cuda_only(machine, "pinned host memory for copies to the GPU") : ""));
  for (const int depth : {1, 4})
    lab.rows.push_back(row(fmt::format("workers 2, prefetch {}", depth),
                           {{"num_workers", "2"}, {"prefetch_factor", std::to_string(depth)}}));
  lab.rows.push_back(row("workers 2, copy on the compute stream", {{"num_workers", "2"}, {"h2d_stream", "false"}},
                         cuda_only(machine, "the copy stream")));
  lab.rows.push_back(
      row("workers 2, sample cache 4096", {{"num_workers", "2"}, {"data_cache_samples", "4096"}}));
  return lab;
}

LabExperiment gradient_tricks(const Config& base) {
  LabExperiment lab{2, "Gradient tricks",
                    "what recomputation and accumulation cost and save at the same global batch", {}, ""};
  const Config resolved = resolve_config(base, 1);
  const int64_t global = resolved.global_batch_size;
  for (const int64_t split : {1, 2, 4}) {
    const int64_t micro = global / split;
    const std::string shape = fmt::format("micro-batch {} x accumulation {}", micro, split);
    for (const std::string recompute : {"none", "selective", "full"}) {
      Settings settings = {{"micro_batch_size", std::to_string(micro)},
                           {"global_batch_size", std::to_string(global)},
                           {"recompute_granularity", recompute}};
      if (recompute == "full") settings.emplace_back("recompute_method", "uniform");
      const std::string unavailable =
          micro >= 1 && global % split == 0
              ? ""
              : fmt::format("the global batch {} does not split into {} micro-batches", global, split);
      lab.rows.push_back(row(fmt::format("{}, recompute {}", shape, recompute), settings, unavailable));
    }
  }
  return lab;
}

LabExperiment precision(const LabMachine& machine) {
  LabExperiment lab{3, "Mixed precision", "what each number format buys in speed and memory", {}, ""};
  const Settings off = {{"fp16", "false"}, {"bf16", "false"}, {"tf32", "false"}, {"fp8_format", ""}};
  const auto with = [&](const std::string& key, const std::string& value) {
    Settings settings = off;
    for (auto& [k, v] : settings)
      if (k == key) v = value;
    return settings;
  };
  lab.rows.push_back(row("fp32", off));
  lab.rows.push_back(row("tf32", with("tf32", "true"), cuda_only(machine, "TF32 (tensor cores)")));
  lab.rows.push_back(row("fp16 with loss scaling", with("fp16", "true")));
  lab.rows.push_back(row("bf16", with("bf16", "true")));
  Settings fp8 = with("bf16", "true");
  for (auto& [k, v] : fp8)
    if (k == "fp8_format") v = "hybrid";
  lab.rows.push_back(row("fp8 (hybrid) on bf16", fp8));
  return lab;
}

LabExperiment storage(const Config& base, const LabPlanOptions& options) {
  LabExperiment lab{4, "Storage", "what reading the data from a local file, S3 or S3 behind a local cache costs", {},
                    ""};
  if (base.mock_data) {
    lab.unavailable = "the base configuration trains on generated tokens (--mock-data): nothing is read";
    return lab;
  }
  if (is_s3_uri(base.data_path)) {
    lab.unavailable = "the base data is on S3: give kiln lab a local --data-path and its copy as --s3-data-path";
    return lab;
  }
  const std::string no_s3 = options.s3_data_path.empty()
                                ? "no --s3-data-path given (the same data on an S3 endpoint)"
                                : "";
  lab.rows.push_back(row("local file, memory-mapped", {{"data_io", "mmap"}}));
  lab.rows.push_back(row("local file, pread", {{"data_io", "pread"}}));
  lab.rows.push_back(row("S3", {{"data_path", options.s3_data_path}, {"cache_dir", ""}}, no_s3));
  lab.rows.push_back(row("S3 through the local cache", {{"data_path", options.s3_data_path},
                                                        {"cache_dir", options.s3_cache_dir}},
                         no_s3));
  return lab;
}

LabExperiment data_parallel(const Config& base, const LabMachine& machine) {
  LabExperiment lab{6, "Data-parallel ranks", "what more ranks buy at the same global batch", {}, ""};
  const Config resolved = resolve_config(base, 1);
  const int64_t global = resolved.global_batch_size;
  for (const int ranks : {1, 2, 4}) {
    std::string unavailable;
    if (global % ranks != 0)
      unavailable = fmt::format("the global batch {} does not split over {} ranks", global, ranks);
    else if (machine.cuda && ranks > machine.gpus)
      unavailable = fmt::format("{} ranks need {} GPUs; this machine has {}", ranks, ranks, machine.gpus);
    // The largest micro-batch that divides a rank's share and is no larger than the base's: the
    // ranks hold no more activations than the baseline.
    int64_t micro = std::max<int64_t>(1, std::min(resolved.micro_batch_size, global / ranks));
    while (global / ranks % micro != 0) --micro;
    lab.rows.push_back(row(fmt::format("{} rank{}", ranks, ranks > 1 ? "s" : ""),
                           {{"micro_batch_size", std::to_string(micro)},
                            {"global_batch_size", std::to_string(global)}},
                           unavailable, ranks));
  }
  return lab;
}

}  // namespace

std::vector<LabExperiment> plan_labs(const Config& base, const LabMachine& machine, const LabPlanOptions& options) {
  std::vector<LabExperiment> labs;
  for (const int number : options.labs) {
    KILN_CHECK(number >= 1 && number <= 6, "--labs: lab {} does not exist (the labs are 1 to 6)", number);
    switch (number) {
      case 1: labs.push_back(data_preloading(machine)); break;
      case 2: labs.push_back(gradient_tricks(base)); break;
      case 3: labs.push_back(precision(machine)); break;
      case 4: labs.push_back(storage(base, options)); break;
      case 5: labs.push_back(LabExperiment{5, "All together", "", {}, ""}); break;
      case 6: labs.push_back(data_parallel(base, machine)); break;
    }
  }
  for (LabExperiment& lab : labs)
    if (!lab.rows.empty()) lab.rows.front().baseline = true;
  return labs;
}

LabExperiment plan_all_together(const std::vector<LabExperiment>& labs) {
  LabExperiment lab{5, "All together", "what the fastest setting of each lab gives combined", {}, ""};
  Settings combined;
  std::vector<std::string> sources;
  for (const LabExperiment& measured : labs) {
    if (measured.number > 4) continue;
    const LabRowResult* fastest = nullptr;
    for (const LabRowResult& candidate : measured.rows)
      if (candidate.measured &&
          (!fastest || candidate.measured->samples_per_second > fastest->measured->samples_per_second))
        fastest = &candidate;
    if (!fastest) continue;
    sources.push_back(fmt::format("lab {}: {}", measured.number, fastest->name));
    for (const auto& setting : fastest->settings) {
      const auto same_key = [&](const auto& entry) { return entry.first == setting.first; };
      combined.erase(std::remove_if(combined.begin(), combined.end(), same_key), combined.end());
      combined.push_back(setting);
    }
  }
  if (sources.empty()) {
    lab.unavailable = "no row of labs 1-4 was measured in this run (ask for them with --labs)";
    return lab;
  }
  std::string name;
  for (const std::string& source : sources) name += (name.empty() ? "" : "; ") + source;
  lab.rows.push_back(row("the base configuration", {}));
  lab.rows.front().baseline = true;
  lab.rows.push_back(row(name, combined));
  return lab;
}

Config with_settings(Config base, const LabRowResult& row) {
  for (const auto& [key, value] : row.settings) {
    const auto& fields = config_fields();
    const auto field = std::find_if(fields.begin(), fields.end(), [&](const ConfigField& f) { return f.key == key; });
    KILN_CHECK(field != fields.end(), "kiln lab: no config key '{}'", key);
    set_config_field(base, *field, value, fmt::format("kiln lab row '{}', key {}", row.name, key));
  }
  return base;
}

}  // namespace kiln
