// TensorBoard scalars from training, read back with the independent reader (event_file_reader.h):
// Megatron's tags at the right steps and with the values the observers were given, `vs samples`
// twins, validation, the interval and the timers' means, a resumed run's new file, the run's config
// and estimate as text summaries at its start, the flags, a run that goes on when the disk fails,
// and the real TensorBoard's reading where it is installed.
#include "kiln/obs/tensorboard_observer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "kiln/train/trainer.h"
#include "obs/event_file_reader.h"
#include "support/error_of.h"
#include "support/kiln_process.h"
#include "support/recorded_runs.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;
using testing::ScalarSeries;
using testing::TempDir;

using Recorder = testing::IterationRecorder;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// `tag` at `step` and `tag vs samples` at `samples`, both `value` as the float TensorBoard keeps.
void expect_scalar(const ScalarSeries& series, const std::string& tag, int64_t step, int64_t samples, double value) {
  const auto expected = static_cast<float>(value);
  ASSERT_TRUE(series.contains(tag) && series.at(tag).contains(step)) << tag << " at " << step;
  EXPECT_EQ(series.at(tag).at(step), expected) << tag << " at " << step;
  const std::string twin = tag + " vs samples";
  ASSERT_TRUE(series.contains(twin) && series.at(twin).contains(samples)) << twin << " at " << samples;
  EXPECT_EQ(series.at(twin).at(samples), expected) << twin << " at " << samples;
}

std::set<int64_t> steps_of(const ScalarSeries& series, const std::string& tag) {
  std::set<int64_t> steps;
  if (series.contains(tag))
    for (const auto& [step, value] : series.at(tag)) steps.insert(step);
  return steps;
}

Config tiny_config() {
  Config config;
  config.num_layers = 1;
  config.hidden_size = 16;
  config.num_attention_heads = 2;
  config.seq_length = 16;
  config.vocab_size = 64;
  config.mock_data = true;
  config.micro_batch_size = 2;
  config.global_batch_size = 4;
  config.train_iters = 4;
  config.lr = 1e-3;
  config.eval_interval = 2;
  config.eval_iters = 1;
  config.num_workers = 0;
  return config;
}

constexpr TensorBoardOptions kEverything{
    .log_interval = 1, .log_timers = true, .log_batch_size = true, .log_world_size = true, .log_memory = true,
    .log_validation_ppl = true};

TEST(TensorBoardTraining, MegatronTagsCarryTheValuesOfEachIteration) {
  const TempDir dir;
  Trainer trainer(tiny_config());
  Recorder recorder;
  auto tensorboard = std::make_unique<TensorBoardObserver>(TensorBoardWriter::create_in(dir / "tb", 1000), kEverything,
                                                           trainer.state().consumed_samples);
  trainer.add_observer(&recorder);
  trainer.add_observer(tensorboard.get());
  const double started = now_seconds();
  trainer.run();
  const std::string file = tensorboard->writer().path();
  tensorboard.reset();  // closes the file
  const double ended = now_seconds();

  const auto events = testing::read_event_file(file);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_GE(events[i].wall_time, started - 1.0);
    EXPECT_LE(events[i].wall_time, ended + 1.0);
    if (i > 0) {
      EXPECT_GE(events[i].wall_time, events[i - 1].wall_time);
    }
  }
  const ScalarSeries series = testing::scalar_series(events);
  std::set<std::string> tags;
  for (const char* tag :
       {"lm loss", "learning-rate", "loss-scale", "grad-norm", "batch-size", "world-size", "iteration-time",
        "throughput", "batch-generator-time", "all-grads-sync-time", "lm loss validation", "lm loss validation ppl",
        "mem-allocated-bytes", "mem-max-allocated-bytes", "mem-reserved-bytes"}) {
    tags.insert(tag);
    tags.insert(std::string(tag) + " vs samples");
  }
  std::set<std::string> written;
  for (const auto& [tag, values] : series) written.insert(tag);
  EXPECT_EQ(written, tags);

  ASSERT_EQ(recorder.iterations.size(), 4u);
  for (const IterationStats& it : recorder.iterations) {
    SCOPED_TRACE("iteration " + std::to_string(it.iteration));
    const int64_t step = it.iteration, samples = it.consumed_samples;
    EXPECT_EQ(samples, 4 * step);
    expect_scalar(series, "lm loss", step, samples, it.lm_loss);
    expect_scalar(series, "learning-rate", step, samples, it.learning_rate);
    expect_scalar(series, "loss-scale", step, samples, it.loss_scale);
    expect_scalar(series, "grad-norm", step, samples, it.grad_norm);
    expect_scalar(series, "batch-size", step, samples, 4.0);
    expect_scalar(series, "world-size", step, samples, 1.0);
    expect_scalar(series, "iteration-time", step, samples, it.elapsed_ms * 1e-3);
    expect_scalar(series, "throughput", step, samples, it.tflops_per_gpu);
    expect_scalar(series, "batch-generator-time", step, samples, it.data_wait_ms * 1e-3);
    expect_scalar(series, "all-grads-sync-time", step, samples, it.grad_reduce_wait_ms * 1e-3);
    // The trainer's buffers: the model, optimizer state and activations, all held from before the
    // first step, so the current bytes are the peak and the same at every step (CPU: no driver).
    EXPECT_EQ(it.memory_allocated_bytes, static_cast<int64_t>(trainer.backend().peak_allocated_bytes()));
    EXPECT_EQ(it.memory_max_allocated_bytes, it.memory_allocated_bytes);
    EXPECT_EQ(it.device_memory_used_bytes, 0);
    EXPECT_GT(static_cast<double>(it.memory_allocated_bytes), 4.0 * static_cast<double>(trainer.model().num_parameters()));
    expect_scalar(series, "mem-allocated-bytes", step, samples, static_cast<double>(it.memory_allocated_bytes));
    expect_scalar(series, "mem-max-allocated-bytes", step, samples, static_cast<double>(it.memory_max_allocated_bytes));
    expect_scalar(series, "mem-reserved-bytes", step, samples, static_cast<double>(it.memory_allocated_bytes));
  }
  EXPECT_EQ(steps_of(series, "lm loss"), (std::set<int64_t>{1, 2, 3, 4}));
  EXPECT_GT(series.at("iteration-time").at(1), 0.0f);
  EXPECT_GT(series.at("throughput").at(1), 0.0f);

  ASSERT_EQ(recorder.validations.size(), 2u);  // at 2 and at 4
  for (const ValidationStats& validation : recorder.validations) {
    SCOPED_TRACE("validation at " + std::to_string(validation.iteration));
    expect_scalar(series, "lm loss validation", validation.iteration, 4 * validation.iteration, validation.lm_loss);
    expect_scalar(series, "lm loss validation ppl", validation.iteration, 4 * validation.iteration,
                  validation.perplexity);
  }
  EXPECT_EQ(steps_of(series, "lm loss validation"), (std::set<int64_t>{2, 4}));
}

TEST(TensorBoardObserver, WritesEveryIntervalWithTheTimersMeanSinceTheLastWrite) {
  const TempDir dir;
  TensorBoardObserver observer(TensorBoardWriter::open_file(dir / "events", 100),
                               {.log_interval = 2, .log_timers = true}, 0);
  for (int64_t it = 1; it <= 5; ++it) {
    IterationStats stats;
    stats.iteration = it;
    stats.consumed_samples = 8 * it;
    stats.elapsed_ms = 100.0 * static_cast<double>(it);
    stats.data_wait_ms = 10.0 * static_cast<double>(it);
    stats.grad_reduce_wait_ms = static_cast<double>(it);
    stats.tflops_per_gpu = 2.0 * static_cast<double>(it);
    stats.lm_loss = static_cast<double>(it);
    observer.on_iteration(stats);
  }
  observer.on_validation({3, 2.0, std::exp(2.0), false, {}});  // after iteration 5: 40 samples
  observer.writer().flush();
  const ScalarSeries series = testing::scalar_series(testing::read_event_file(dir / "events"));

  EXPECT_EQ(steps_of(series, "lm loss"), (std::set<int64_t>{2, 4}));  // not 1, 3, 5
  EXPECT_EQ(steps_of(series, "lm loss vs samples"), (std::set<int64_t>{16, 32}));
  expect_scalar(series, "lm loss", 4, 32, 4.0);           // the iteration's own loss, not a mean
  expect_scalar(series, "iteration-time", 2, 16, 0.150);  // (100 + 200) / 2 ms
  expect_scalar(series, "iteration-time", 4, 32, 0.350);  // (300 + 400) / 2 ms
  expect_scalar(series, "throughput", 4, 32, 7.0);
  expect_scalar(series, "batch-generator-time", 2, 16, 0.015);
  expect_scalar(series, "all-grads-sync-time", 4, 32, 0.0035);
  expect_scalar(series, "lm loss validation", 3, 40, 2.0);
  for (const char* off : {"batch-size", "world-size", "lm loss validation ppl"})
    EXPECT_FALSE(series.contains(off)) << off << " is written without its switch";

  // A validation before any iteration (a run resumed at its end) is keyed by the samples it began with.
  TensorBoardObserver resumed(TensorBoardWriter::open_file(dir / "resumed", 100), {}, 96);
  resumed.on_validation({24, 1.5, std::exp(1.5), true, {}});
  resumed.writer().flush();
  expect_scalar(testing::scalar_series(testing::read_event_file(dir / "resumed")), "lm loss validation", 24, 96, 1.5);
}

TEST(TensorBoardObserver, RunStartIsTheConfigAndEstimateAsTextsAtTheFirstIteration) {
  const TempDir dir;
  TensorBoardObserver observer(TensorBoardWriter::open_file(dir / "events", 100), {}, 96);
  observer.write_run_start("num_layers: 2\n", R"({"parameters": 10})", 24);
  observer.writer().flush();
  const auto events = testing::read_event_file(dir / "events");
  const testing::TextSeries texts = testing::text_series(events);
  EXPECT_EQ(texts, (testing::TextSeries{{"config", {{24, "num_layers: 2\n"}}},
                                        {"estimate", {{24, R"({"parameters": 10})"}}}}));
  EXPECT_TRUE(testing::scalar_series(events).empty());  // texts only: nothing for the scalars dashboard
}

TEST(TensorBoardTraining, FailedWritesNeverStopTheRun) {
  Trainer trainer(tiny_config());
  Recorder recorder;
  ::testing::internal::CaptureStderr();
  {
    TensorBoardObserver tensorboard(TensorBoardWriter::open_file("/dev/full", 1000), kEverything, 0);
    trainer.add_observer(&tensorboard);
    trainer.add_observer(&recorder);
    trainer.run();
    tensorboard.writer().flush();
    EXPECT_TRUE(tensorboard.writer().write_failed());
  }
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(recorder.iterations.size(), 4u);
  EXPECT_EQ(recorder.validations.size(), 2u);
  std::regex report("kiln: TensorBoard: writing '/dev/full' failed");
  EXPECT_EQ(std::distance(std::sregex_iterator(said.begin(), said.end(), report), std::sregex_iterator()), 1) << said;
}

// The `kiln train` command line of a tiny run that saves to and resumes from DIR/ckpt.
std::string tiny_train(const std::string& dir, int64_t train_iters, const std::string& extra = "") {
  return fmt::format(
      "train --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --vocab-size 64 --mock-data "
      "--micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --eval-iters 1 --eval-interval 2 --log-interval 1 "
      "--num-workers 0 --save {0}/ckpt --load {0}/ckpt --train-iters {1} --tensorboard-dir {0}/tb {2}",
      dir, train_iters, extra);
}

// iteration -> lm loss of the Megatron log lines in `output`.
std::map<int64_t, double> logged_losses(const std::string& output) {
  std::map<int64_t, double> losses;
  const std::regex line(R"(iteration\s+(\d+)/\s*\d+ \|.*? lm loss: ([-+.0-9eE]+) \|)");
  for (auto match = std::sregex_iterator(output.begin(), output.end(), line); match != std::sregex_iterator(); ++match)
    losses[std::stoll((*match)[1].str())] = std::stod((*match)[2].str());
  return losses;
}

TEST(TensorBoardCli, ResumedRunAddsAFileWhoseStepsContinue) {
  const TempDir dir;
  const testing::CommandResult first = testing::run_kiln(tiny_train(dir.path(), 3));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("TensorBoard events: " + dir / "tb/events.out.tfevents."), std::string::npos)
      << first.output;
  const testing::CommandResult second = testing::run_kiln(tiny_train(dir.path(), 6));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  ASSERT_NE(second.output.find("resumed from"), std::string::npos) << second.output;

  const std::vector<std::string> files = testing::event_files_in(dir / "tb");
  ASSERT_EQ(files.size(), 2u);
  ScalarSeries before = testing::scalar_series(testing::read_event_file(files[0]));
  ScalarSeries after = testing::scalar_series(testing::read_event_file(files[1]));
  if (steps_of(before, "lm loss").contains(4)) std::swap(before, after);  // names sort by second, then pid
  EXPECT_EQ(steps_of(before, "lm loss"), (std::set<int64_t>{1, 2, 3}));
  EXPECT_EQ(steps_of(after, "lm loss"), (std::set<int64_t>{4, 5, 6}));
  EXPECT_EQ(steps_of(after, "lm loss vs samples"), (std::set<int64_t>{16, 20, 24}));
  EXPECT_EQ(steps_of(before, "lm loss validation"), (std::set<int64_t>{2, 3}));  // 3: the end
  EXPECT_EQ(steps_of(after, "lm loss validation"), (std::set<int64_t>{4, 6}));
  // Each file starts with the config it ran under, at the iteration it started from.
  for (const std::string& file : files) {
    const testing::TextSeries texts = testing::text_series(testing::read_event_file(file));
    const int64_t start = texts.at("config").begin()->first;
    EXPECT_TRUE(start == 0 || start == 3) << file;
    EXPECT_NE(texts.at("config").at(start).find(fmt::format("train_iters: {}\n", start == 0 ? 3 : 6)),
              std::string::npos);
    EXPECT_TRUE(texts.at("estimate").contains(start));
  }
  // The values are the log line's (which prints seven significant digits).
  for (const auto& [run, series] : {std::pair{&first, &before}, {&second, &after}}) {
    const std::map<int64_t, double> logged = logged_losses(run->output);
    ASSERT_EQ(logged.size(), 3u) << run->output;
    for (const auto& [iteration, loss] : logged)
      EXPECT_NEAR(series->at("lm loss").at(iteration), loss, 1e-6 * loss) << "iteration " << iteration;
  }
}

TEST(TensorBoardCli, RunStartsWithItsConfigAndEstimateAsTexts) {
  const TempDir dir;
  const testing::CommandResult run = testing::run_kiln(tiny_train(dir.path(), 2));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const testing::CommandResult printed = testing::run_kiln(tiny_train(dir.path(), 2, "--print-config"));
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  const testing::TextSeries texts =
      testing::text_series(testing::read_event_file(testing::event_files_in(dir / "tb").at(0)));
  ASSERT_TRUE(texts.contains("config") && texts.at("config").contains(0)) << run.output;
  EXPECT_EQ(texts.at("config").at(0), printed.output);  // what --print-config prints
  ASSERT_TRUE(texts.contains("estimate") && texts.at("estimate").contains(0));
  const auto estimate = nlohmann::json::parse(texts.at("estimate").at(0));
  Config config = tiny_config();
  config.resolve();
  EXPECT_EQ(estimate.at("parameters").get<int64_t>(), Trainer(config).model().num_parameters());
  EXPECT_EQ(estimate.at("tokens_per_iteration").get<int64_t>(), 4 * 16);
  EXPECT_EQ(estimate.at("data_parallel_size").get<int64_t>(), 1);
  EXPECT_GT(estimate.at("memory_bytes_per_gpu").get<double>(), 0.0);
  EXPECT_TRUE(estimate.at("device").get<std::string>().starts_with("cpu")) << estimate;
  EXPECT_FALSE(estimate.contains("seconds_per_iteration")) << "no datasheet times a CPU: " << estimate;
}

TEST(TensorBoardCli, UnwritableFolderStopsTheRunBeforeItsFirstStep) {
  const TempDir dir;
  testing::write_file_bytes(dir / "a-file", "x");
  const testing::CommandResult result =
      testing::run_kiln(tiny_train(dir.path(), 3, "--tensorboard-dir " + dir / "a-file/tb"));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("kiln: error: cannot write TensorBoard events into '" + dir / "a-file/tb" +
                               "': cannot create the folder"),
            std::string::npos)
      << result.output;
  EXPECT_TRUE(logged_losses(result.output).empty()) << result.output;
}

TEST(TensorBoardConfig, MegatronFlagsDefaultsAndBadValues) {
  const Config defaults;
  EXPECT_EQ(defaults.tensorboard_dir, "");
  EXPECT_EQ(defaults.tensorboard_log_interval, 1);
  EXPECT_EQ(defaults.tensorboard_queue_size, 1000);
  const testing::CommandResult printed = testing::run_kiln(
      "train --mock-data --vocab-size 64 --tensorboard-dir TB --tensorboard-log-interval 5 --tensorboard-queue-size 7 "
      "--log-timers-to-tensorboard --log-batch-size-to-tensorboard --log-validation-ppl-to-tensorboard "
      "--log-memory-to-tensorboard --log-world-size-to-tensorboard --print-config");
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  for (const char* line : {"tensorboard_dir: TB\n", "tensorboard_log_interval: 5\n", "tensorboard_queue_size: 7\n",
                           "log_timers_to_tensorboard: true\n", "log_batch_size_to_tensorboard: true\n",
                           "log_validation_ppl_to_tensorboard: true\n", "log_memory_to_tensorboard: true\n",
                           "log_world_size_to_tensorboard: true\n"})
    EXPECT_NE(printed.output.find(line), std::string::npos) << line << printed.output;

  for (auto [member, key] : {std::pair{&Config::tensorboard_log_interval, "tensorboard_log_interval"},
                             std::pair{&Config::tensorboard_queue_size, "tensorboard_queue_size"}}) {
    Config config;
    config.vocab_size = 64;
    config.*member = 0;
    config.resolve();
    EXPECT_EQ(error_of([&] { config.validate(); }), fmt::format("config key '{}' must be positive, got 0", key));
  }
}

// TensorBoard's own reader (its Python package), where one is installed: same tags, steps, values, and the
// texts as the text plugin's.
TEST(TensorBoardReal, TensorBoardReadsTheScalarsAndTextsKilnWrote) {
  if (testing::run_command("python3 -c 'import tensorboard'").exit_code != 0)
    GTEST_SKIP() << "python3 has no tensorboard module here (pip's tensorboard; it comes with most PyTorch set-ups)";
  const TempDir dir;
  {
    TensorBoardObserver observer(TensorBoardWriter::create_in(dir / "tb", 100), kEverything, 0);
    observer.write_run_start("num_layers: 2\nlr: 0.001\n", R"({"parameters": 10})", 0);
    for (int64_t it = 1; it <= 3; ++it) {
      IterationStats stats;
      stats.iteration = it;
      stats.consumed_samples = 4 * it;
      stats.lm_loss = 5.0 / static_cast<double>(it);
      stats.learning_rate = 1e-4 * static_cast<double>(it);
      stats.elapsed_ms = 12.5;
      observer.on_iteration(stats);
    }
    observer.on_validation({3, 1.25, std::exp(1.25), true, {}});
  }
  const ScalarSeries expected =
      testing::scalar_series(testing::read_event_file(testing::event_files_in(dir / "tb")[0]));
  // Texts print as "text TAG STEP JSON-STRING" lines, which the scalars' tab-separated pattern skips.
  testing::write_file_bytes(dir / "read.py", R"py(import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
accumulator = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
accumulator.Reload()
tags = accumulator.Tags()
for tag in tags.get("scalars", []):
    for event in accumulator.Scalars(tag):
        print(f"{tag}\t{event.step}\t{event.value!r}")
if tags.get("tensors"):  # the texts; and versions that turn simple_value into the scalars plugin's tensors
    from tensorboard.util import tensor_util
    for tag in tags["tensors"]:
        plugin = accumulator.SummaryMetadata(tag).plugin_data.plugin_name
        for event in accumulator.Tensors(tag):
            value = tensor_util.make_ndarray(event.tensor_proto)
            if plugin == "text":
                print(f"text {tag} {event.step} {json.dumps(value.item().decode())}")
            else:
                print(f"{tag}\t{event.step}\t{float(value)!r}")
)py");
  const testing::CommandResult read = testing::run_command("python3 " + dir / "read.py" + " " + dir / "tb");
  ASSERT_EQ(read.exit_code, 0) << read.output;
  EXPECT_NE(read.output.find(R"(text config 0 "num_layers: 2\nlr: 0.001\n")"), std::string::npos) << read.output;
  EXPECT_NE(read.output.find(R"(text estimate 0 "{\"parameters\": 10}")"), std::string::npos) << read.output;
  ScalarSeries seen;
  const std::regex line(R"(([^\t\n]+)\t(\d+)\t([^\t\n]+))");
  for (auto match = std::sregex_iterator(read.output.begin(), read.output.end(), line); match != std::sregex_iterator();
       ++match)
    seen[(*match)[1].str()][std::stoll((*match)[2].str())] = static_cast<float>(std::stod((*match)[3].str()));
  EXPECT_EQ(seen, expected) << read.output;
}

}  // namespace
}  // namespace kiln
