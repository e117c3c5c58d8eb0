// `kiln lab`: the seed lab's six experiments (lab/lab_plan.h) over any configuration, measured
// with the real Trainer (lab/lab_runner.h): a table for people, --json for machines and --report
// for a self-contained HTML page with one bar chart per lab (obs/lab_report.h). Progress goes to
// stderr, so stdout holds the table or the JSON alone.
//
// The base configuration is `kiln train`'s flags and --config. When neither --config nor --model
// names a model, it is the seed lab's classifier scaled to the device (lab/lab_defaults.h:
// --device, else cuda where a GPU is visible) under the flags. Without --data-path or --mock-data
// the lab writes data into a temporary folder (removed at the end), so the loader reads real
// files: synthetic text for the classifier, which the loader's workers tokenize; random-token
// shards for GPT. Rows of several ranks run as that many local processes over Gloo (NCCL on
// GPUs), started as `kiln launch` starts them, each of one thread when the cores allow: each is
// this command again with the hidden --measure-row, which joins the group, measures the row and,
// on rank 0, writes its numbers to a JSON file for the parent.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "kiln/backend/registry.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/config_flags.h"
#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/dist/bootstrap.h"
#include "kiln/dist/process_group.h"
#include "kiln/dist/worker_group.h"
#include "kiln/lab/lab_defaults.h"
#include "kiln/lab/lab_runner.h"
#include "kiln/obs/lab_report.h"
#include "kiln/obs/nvml_library.h"
#include "kiln/train/model_kinds.h"
#include "kiln/train/trainer.h"
#include "kiln/train/training_data.h"

namespace kiln::cli {
namespace {

struct LabOptions {
  std::vector<int> labs = {1, 2, 3, 4, 5, 6};
  int64_t warmup_iters = 2, timed_iters = 5;
  bool json = false;
  std::string report, s3_data_path, measure_row;
};

// A folder removed with everything in it when this goes out of scope.
class ScratchFolder {
 public:
  ScratchFolder() {
    std::string pattern = (std::filesystem::temp_directory_path() / "kiln-lab-XXXXXX").string();
    KILN_CHECK(mkdtemp(pattern.data()) != nullptr, "kiln lab: cannot make a scratch folder under {}",
               std::filesystem::temp_directory_path().string());
    path_ = pattern;
  }
  ~ScratchFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string executable_path() {
  char path[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  KILN_CHECK(length > 0, "kiln lab: cannot find its own executable (/proc/self/exe)");
  return std::string(path, static_cast<size_t>(length));
}

LabMeasurement measurement_from_json(const std::string& path) {
  std::ifstream in(path);
  KILN_CHECK(in.good(), "kiln lab: rank 0 of a multi-rank row wrote no measurement ({})", path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  KILN_CHECK(!j.is_discarded() && j.is_object(), "kiln lab: {} is not a measurement", path);
  LabMeasurement m;
  m.samples_per_second = j.at("samples_per_second").get<double>();
  m.step_ms = j.at("step_ms").get<double>();
  m.peak_memory_bytes = j.at("peak_memory_bytes").get<int64_t>();
  m.data_wait_share = j.at("data_wait_share").get<double>();
  m.final_loss = j.at("final_loss").get<double>();
  return m;
}

// `ranks` local processes measuring `config` (this command with --measure-row), as kiln launch
// starts them; rank 0's numbers.
LabMeasurement launch_ranks(const Config& config, int ranks, const LabOptions& options, const std::string& scratch) {
  static int launched = 0;
  const std::string stem = fmt::format("{}/ranks-{}-{}", scratch, ranks, launched++);
  write_file_atomically(stem + ".yaml", to_yaml(config));
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  dist::WorkerGroupOptions group;
  group.command = {executable_path(), "lab", "--measure-row", stem + ".json", "--config", stem + ".yaml",
                   "--warmup-iters", std::to_string(options.warmup_iters), "--timed-iters",
                   std::to_string(options.timed_iters)};
  group.message_prefix = "kiln lab: ";
  group.forward_signals = true;
  const int port = dist::find_free_port();
  for (int rank = 0; rank < ranks; ++rank)
    group.workers.push_back(
        {rank,
         {fmt::format("RANK={}", rank), fmt::format("WORLD_SIZE={}", ranks), fmt::format("LOCAL_RANK={}", rank),
          fmt::format("LOCAL_WORLD_SIZE={}", ranks), "GROUP_RANK=0", "MASTER_ADDR=127.0.0.1",
          fmt::format("MASTER_PORT={}", port), fmt::format("OMP_NUM_THREADS={}", std::max(1, cores / ranks))}});
  dist::WorkerGroup workers(group);
  workers.start();
  const dist::GroupExit exit = workers.wait();
  KILN_CHECK(exit.status == 0, "kiln lab: the run on {} ranks failed (rank {}, status {})", ranks, exit.failed_rank,
             exit.status);
  return measurement_from_json(stem + ".json");
}

// The hidden mode behind launch_ranks: one rank of a multi-rank row.
void measure_one_row(const ConfigFlags& flags, const LabOptions& options) {
  const Config config = flags.build();
  const ProcessPlace place = find_process_place(process_environment());
  std::unique_ptr<ProcessGroup> group;
  if (place.joins_group()) {
    const Config wanted = resolve_config(config, place.world_size);
    group = join_process_group(place, wanted.resolved_distributed_backend(), wanted.distributed_timeout(),
                               to_yaml(wanted));
  }
  const LabMeasurement m = measure_row(config, options.warmup_iters, options.timed_iters,
                                       group ? group->communicator.get() : nullptr, place.local_rank);
  if (place.rank != 0) return;
  write_file_atomically(options.measure_row,
                        nlohmann::json{{"samples_per_second", m.samples_per_second}, {"step_ms", m.step_ms},
                                       {"peak_memory_bytes", m.peak_memory_bytes},
                                       {"data_wait_share", m.data_wait_share}, {"final_loss", m.final_loss}}
                            .dump());
}

LabMachine this_machine(const Config& base) {
  LabMachine machine;
  machine.cuda = base.device == "cuda";
  machine.cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (machine.cuda) {
    std::string why_not;
    const std::unique_ptr<NvmlLibrary> nvml = NvmlLibrary::load(why_not);
    const auto count = nvml ? nvml->device_count(why_not) : std::nullopt;
    machine.gpus = count ? static_cast<int>(*count) : 1;
  }
  return machine;
}

// kiln train's reading of --config and the flags; or, when neither names a model, the lab's
// classifier for the device the flags name (cuda where a GPU is visible when they name none) under
// the flags. Whether a flag was given is the parser's count, not a comparison with its default.
Config base_configuration(const CLI::App& command, const ConfigFlags& flags) {
  if (!flags.config_file.empty() || command.get_option("--model")->count() > 0) return flags.build();
  const bool cuda = command.get_option("--device")->count() > 0 ? flags.build().device == "cuda"
                                                                 : cuda_device_count() > 0;
  return flags.build(lab_classifier_base(cuda));
}

// Writes the base's default data into `dir` and points the base at it (lab/lab_defaults.h): text
// for a classifier, whose vocabulary is then its tokenizer's; random tokens for GPT (vocabulary
// 4096 unless given). Returns what the data is, for the results' model line.
std::string write_default_data(Config& base, const std::string& dir) {
  std::filesystem::create_directories(dir);
  base.data_path = dir;
  if (model_kind(base.model).input == ModelInput::LabelledSequences) {
    const SyntheticTextOptions text{.seq_length = base.seq_length,
                                    .num_labels = base.num_labels,
                                    .text_key = base.text_key,
                                    .label_key = base.label_key,
                                    .seed = static_cast<uint64_t>(base.seed)};
    write_synthetic_text(dir + "/train.jsonl", text);
    const int64_t tokens = data_vocab_size(base, ModelInput::LabelledSequences);
    if (base.vocab_size == 0) base.vocab_size = tokens;
    KILN_CHECK(base.vocab_size >= tokens,
               "kiln lab: its synthetic text is tokenized into a vocabulary of {} (its tokenizer's), more than "
               "--vocab-size {}; leave --vocab-size out, or give your own --data-path",
               tokens, base.vocab_size);
    return fmt::format("synthetic text ({} rows of lexicon words) tokenized by the loader", text.rows);
  }
  if (base.vocab_size == 0) base.vocab_size = 4096;
  write_random_token_data(dir, base.vocab_size, static_cast<uint64_t>(base.seed));
  return "random tokens read from disk";
}

// One line: the model as the run's log describes it, then the batch, precision and data.
std::string model_line(const Config& base, const std::string& data) {
  const Config c = resolve_config(base, 1);
  return fmt::format("{}; seq {}, micro-batch {}, global batch {}, {}; {}", c.architecture()->describe(),
                     c.seq_length, c.micro_batch_size, c.global_batch_size, c.precision_name(), data);
}

void run_lab(const CLI::App& command, const ConfigFlags& flags, const LabOptions& options) {
  if (!options.measure_row.empty()) return measure_one_row(flags, options);
  Config base = base_configuration(command, flags);
  const ScratchFolder scratch;
  std::string data = base.mock_data ? "generated on the fly (--mock-data)" : "data " + base.data_path;
  if (!base.mock_data && base.data_path.empty()) data = write_default_data(base, scratch.path() + "/data");
  LabPlanOptions plan;
  plan.labs = std::set<int>(options.labs.begin(), options.labs.end());
  plan.s3_data_path = options.s3_data_path;
  plan.s3_cache_dir = scratch.path() + "/s3-cache";
  std::vector<LabExperiment> labs = plan_labs(base, this_machine(base), plan);

  LabRunOptions run;
  run.warmup_iters = options.warmup_iters;
  run.timed_iters = options.timed_iters;
  run.launch_ranks = [&](const Config& config, int ranks) {
    return launch_ranks(config, ranks, options, scratch.path());
  };
  run.on_row = [](const LabExperiment& lab, const LabRowResult& row) {
    fmt::print(stderr, "kiln lab: lab {} ({}): {}\n", lab.number, lab.title, row.name);
  };
  run_labs(base, labs, run);

  LabResults results;
  results.model = model_line(base, data);
  results.machine = fmt::format("{} ({} cores)", base.device, this_machine(base).cores);
  results.warmup_iters = options.warmup_iters;
  results.timed_iters = options.timed_iters;
  results.labs = std::move(labs);
  fmt::print("{}", options.json ? lab_json(results) + "\n" : lab_table(results));
  if (!options.report.empty()) {
    write_lab_report(results, options.report);
    fmt::print(stderr, "kiln lab: report written to {}\n", options.report);
  }
}

}  // namespace

void add_lab_command(CLI::App& root) {
  auto flags = std::make_shared<ConfigFlags>();
  auto options = std::make_shared<LabOptions>();
  CLI::App* command = root.add_subcommand(
      "lab",
      "measure what each training technique buys: the seed lab's six experiments over a configuration (without "
      "--model or --config: the lab's classifier, scaled to this machine, on synthetic text)");
  command->add_option("--labs", options->labs,
                      "which labs, comma-separated: 1 data pre-loading, 2 gradient tricks, 3 precision, 4 storage, "
                      "5 all together, 6 data-parallel ranks (default: all)")
      ->delimiter(',');
  command->add_option("--warmup-iters", options->warmup_iters, "iterations of each row before timing");
  command->add_option("--timed-iters", options->timed_iters, "iterations timed per row (median reported)");
  command->add_flag("--json", options->json, "one JSON document instead of the table");
  command->add_option("--report", options->report, "also write a self-contained HTML report with one chart per lab");
  command->add_option("--s3-data-path", options->s3_data_path,
                      "the base --data-path's copy on S3, for lab 4's S3 rows (endpoint and keys as for kiln train)");
  command->add_option("--measure-row", options->measure_row)->group("");  // internal: one rank of a multi-rank row
  add_config_flags(*command, flags);
  command->callback([command, flags, options] { run_lab(*command, *flags, *options); });
}

}  // namespace kiln::cli
