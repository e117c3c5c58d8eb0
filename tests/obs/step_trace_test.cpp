// The step trace (--profile): the Chrome trace's layout, and what a traced training run records.
#include "kiln/obs/step_trace.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kiln/obs/chrome_trace.h"
#include "kiln/train/trainer.h"
#include "support/error_of.h"
#include "support/kiln_process.h"
#include "support/small_gpt.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::TempDir;
using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

// A complete event of a trace.
struct Complete {
  std::string name, category;
  double start = 0, duration = 0;  // microseconds
  double end() const { return start + duration; }
};

// The complete events of each track (by its thread_name), in file order, and the counters' samples.
struct ParsedTrace {
  std::map<std::string, std::vector<Complete>> tracks;
  std::map<std::string, std::vector<double>> counters;
  std::string process_name;
};

ParsedTrace parse(const json& trace) {
  ParsedTrace parsed;
  std::map<int64_t, std::string> names;
  for (const json& event : trace.at("traceEvents"))
    if (event.at("ph") == "M" && event.at("name") == "thread_name")
      names[event.at("tid").get<int64_t>()] = event.at("args").at("name").get<std::string>();
  for (const json& event : trace.at("traceEvents")) {
    const std::string phase = event.at("ph").get<std::string>();
    if (phase == "M" && event.at("name") == "process_name")
      parsed.process_name = event.at("args").at("name").get<std::string>();
    if (phase == "C") parsed.counters[event.at("name").get<std::string>()].push_back(event.at("args").at("value"));
    if (phase != "X") continue;
    const int64_t tid = event.at("tid").get<int64_t>();
    EXPECT_TRUE(names.contains(tid)) << "a track without a thread_name: " << tid;
    parsed.tracks[names[tid]].push_back({event.at("name").get<std::string>(), event.at("cat").get<std::string>(),
                                         event.at("ts").get<double>(), event.at("dur").get<double>()});
  }
  return parsed;
}

TEST(ChromeTrace, TracksSortedParentsFirstWithNamesAndCounters) {
  trace::Track trainer{"trainer", false, 7, {}};
  // Recorded as spans end: the child before its parent.
  trainer.events.push_back({trace::Event::Kind::Complete, "op", "child", 2'000, 500, 0});
  trainer.events.push_back({trace::Event::Kind::Complete, "step", "parent", 2'000, 3'000, 0});
  trainer.events.push_back({trace::Event::Kind::Counter, "counter", "memory", 2'100, 0, 4096});
  trace::Track stream{"compute stream", true, 3, {{trace::Event::Kind::Complete, "kernel", "k", 2'250, 1'250, 0}}};
  const json trace = json::parse(chrome_trace_json({stream, trainer}, {5, "kiln rank 5", 1'000, {{"producer", "kiln"}}}));

  EXPECT_EQ(trace.at("displayTimeUnit"), "ms");
  EXPECT_EQ(trace.at("otherData").at("producer"), "kiln");
  const json& events = trace.at("traceEvents");
  std::vector<std::string> order;
  for (const json& event : events) {
    EXPECT_EQ(event.at("pid"), 5);
    order.push_back(event.at("ph").get<std::string>() + " " + event.at("name").get<std::string>());
  }
  // The process, then the thread before the device track (whatever their ids), each named and
  // given its place; on each, parents before children.
  EXPECT_EQ(order, (std::vector<std::string>{"M process_name", "M thread_name", "M thread_sort_index", "X parent",
                                             "X child", "C memory", "M thread_name", "M thread_sort_index", "X k"}));
  EXPECT_EQ(events[0].at("args").at("name"), "kiln rank 5");
  EXPECT_EQ(events[1].at("args").at("name"), "trainer");
  EXPECT_EQ(events[1].at("tid"), 7);
  EXPECT_EQ(events[2].at("args").at("sort_index"), 0);
  EXPECT_EQ(events[7].at("args").at("sort_index"), 1);
  // Microseconds from the origin, at the recording's nanoseconds.
  EXPECT_EQ(events[3].at("ts"), 1.0);
  EXPECT_EQ(events[3].at("dur"), 3.0);
  EXPECT_EQ(events[3].at("cat"), "step");
  EXPECT_EQ(events[4].at("dur"), 0.5);
  EXPECT_EQ(events[5].at("ts"), 1.1);
  EXPECT_EQ(events[5].at("args").at("value"), 4096.0);
  EXPECT_EQ(events[8].at("ts"), 1.25);
  EXPECT_EQ(events[8].at("dur"), 1.25);
  EXPECT_EQ(events[8].at("tid"), 3);
}

TEST(StepTraceName, ProfileNameRankSuffixOrPyTorchsDefault) {
  EXPECT_EQ(step_trace_file_name("run", 0, 1), "run.pt.trace.json");
  EXPECT_EQ(step_trace_file_name("run", 3, 4), "run_rank3.pt.trace.json");
  const std::string fallback = step_trace_file_name("", 0, 1);
  EXPECT_NE(fallback.find(fmt::format("_{}.", getpid())), std::string::npos) << fallback;
  EXPECT_TRUE(fallback.ends_with(".pt.trace.json")) << fallback;
}

// A traced training run on the CPU with two loader workers, each a batch ahead: iterations 3 and
// 4 of 5, run once for all the tests of the suite.
class StepTraceTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    Config config = testing::tiny_mock_gpt_config("cpu");
    config.global_batch_size = 4;  // two micro-batches
    config.train_iters = 5;
    config.num_workers = 2;
    config.prefetch_factor = 1;  // two batches ahead: the window's later two are read inside it
    config.profile = true;
    config.profile_step_start = 2;
    config.profile_step_end = 4;
    config.profile_dir = *dir_ / "traces";
    Trainer trainer(config);
    StepTraceObserver observer({.step_start = 2, .step_end = 4, .dir = config.profile_dir, .file_name = "t.pt.trace.json",
                                .rank = 0, .process_name = "kiln rank 0"},
                               *trainer.tracing());
    trainer.add_observer(&observer);
    trainer.run();
    observer.finish();
    allocated_ = static_cast<double>(trainer.backend().allocated_bytes());
    ASSERT_EQ(observer.written_path(), *dir_ / "traces/t.pt.trace.json");
    EXPECT_EQ(observer.written_iterations(), "3..4");
    trace_ = new ParsedTrace(parse(read_json(observer.written_path())));
  }
  static void TearDownTestSuite() {
    delete trace_;
    delete dir_;
  }
  static inline TempDir* dir_ = nullptr;
  static inline ParsedTrace* trace_ = nullptr;
  static inline double allocated_ = 0;
};

TEST_F(StepTraceTraining, RecordsOnlyTheWindowsIterationsOnTheTrainerThread) {
  EXPECT_EQ(trace_->process_name, "kiln rank 0");
  ASSERT_TRUE(trace_->tracks.contains("trainer"));
  std::vector<std::string> steps;
  for (const Complete& event : trace_->tracks.at("trainer"))
    if (event.category == "step") steps.push_back(event.name);
  EXPECT_EQ(steps, (std::vector<std::string>{"iteration 3", "iteration 4"}));
}

TEST_F(StepTraceTraining, OpsNestInPhasesAndPhasesInSteps) {
  const std::vector<Complete>& events = trace_->tracks.at("trainer");
  const auto inside = [](const Complete& inner, const Complete& outer) {
    return inner.start >= outer.start - 1e-3 && inner.end() <= outer.end() + 1e-3;
  };
  std::vector<Complete> steps, parts;
  for (const Complete& event : events)
    if (event.category != "op") (event.category == "step" ? steps : parts).push_back(event);
  const auto inside_one_of = [&](const Complete& event, const std::vector<Complete>& outers) {
    return std::any_of(outers.begin(), outers.end(), [&](const Complete& outer) { return inside(event, outer); });
  };
  std::set<std::string> op_names, phase_names;
  for (const Complete& event : events) {
    if (event.category == "step") continue;
    // Every part lies inside a step, and every op inside a part of it.
    EXPECT_TRUE(inside_one_of(event, steps)) << event.name;
    if (event.category == "op") {
      op_names.insert(event.name.substr(0, event.name.find(' ')));
      EXPECT_TRUE(inside_one_of(event, parts)) << event.name << " at " << event.start;
    } else {
      phase_names.insert(event.name);
    }
  }
  for (const char* op : {"embedding_forward", "layernorm_forward", "matmul_forward", "attention_forward",
                         "softmax_cross_entropy", "matmul_backward", "attention_backward", "embedding_backward",
                         "sum_of_squares", "adamw_step"})
    EXPECT_TRUE(op_names.contains(op)) << op;
  for (const char* phase : {"next micro-batch", "forward (micro-batch 1)", "backward (micro-batch 1)",
                            "forward (micro-batch 2)", "backward (micro-batch 2)", "loss (waits for the device)",
                            "gradient norm", "optimizer step", "synchronize"})
    EXPECT_TRUE(phase_names.contains(phase)) << phase;
}

TEST_F(StepTraceTraining, TheStepsPartsAddUpToTheStep) {
  const std::vector<Complete>& events = trace_->tracks.at("trainer");
  for (const Complete& step : events) {
    if (step.category != "step") continue;
    SCOPED_TRACE(step.name);
    // The step's own parts: not ops, and not inside another part.
    std::vector<const Complete*> parts;
    for (const Complete& event : events)
      if (event.category != "step" && event.category != "op" && event.start >= step.start && event.end() <= step.end())
        parts.push_back(&event);
    double covered = 0;
    for (const Complete* part : parts) {
      const bool nested = std::any_of(parts.begin(), parts.end(), [&](const Complete* other) {
        return other != part && other->start <= part->start && other->end() >= part->end() &&
               other->duration > part->duration;
      });
      if (!nested) covered += part->duration;
    }
    EXPECT_LE(covered, step.duration + 1e-3);
    // What is left is bookkeeping between the parts, and on a loaded machine (CI) the scheduler
    // may put a few milliseconds of another process there.
    const double unaccounted = step.duration - covered;
    EXPECT_TRUE(unaccounted <= 0.1 * step.duration || unaccounted < 2000.0)
        << "the parts leave " << unaccounted << " us of " << step.duration << " unaccounted";
  }
}

TEST_F(StepTraceTraining, LoaderWorkersAndMemoryHaveTracksOfTheirOwn) {
  size_t worker_reads = 0;
  for (const char* worker : {"train loader worker 0", "train loader worker 1"})
    if (trace_->tracks.contains(worker))
      for (const Complete& event : trace_->tracks.at(worker)) {
        EXPECT_EQ(event.category, "data");
        EXPECT_TRUE(event.name.starts_with("read samples ")) << event.name;
        ++worker_reads;
      }
  // The queue holds two batches and the window takes four: the consumer waited for two reads.
  EXPECT_GE(worker_reads, 2u);
  ASSERT_TRUE(trace_->counters.contains("memory allocated (bytes)"));
  for (double bytes : trace_->counters.at("memory allocated (bytes)")) EXPECT_EQ(bytes, allocated_);
}

TEST(StepTraceObserver, AFolderThatCannotBeMadeIsAnErrorNamingIt) {
  const TempDir dir;
  testing::write_file_bytes(dir / "a-file", "x");
  Trainer trainer([] {
    Config config = testing::tiny_mock_gpt_config("cpu");
    config.train_iters = 1;
    config.profile = true;
    config.profile_dir = "unused";
    return config;
  }());
  const std::string error = testing::error_of([&] {
    StepTraceObserver observer({.step_start = 1, .step_end = 2, .dir = dir / "a-file/traces", .file_name = "t.pt.trace.json"},
                               *trainer.tracing());
  });
  EXPECT_NE(error.find("cannot create the trace folder '" + dir / "a-file/traces" + "'"), std::string::npos) << error;
}

std::string tiny_train(const std::string& flags) {
  return "train --mock-data --vocab-size 64 --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 8 "
         "--micro-batch-size 2 --train-iters 3 --eval-iters 0 " + flags;
}

TEST(StepTraceCli, TheCoursesSpellingWritesNamedTraceIntoTheTensorBoardFolder) {
  const TempDir dir;
  const testing::CommandResult run = testing::run_kiln(tiny_train(
      fmt::format("--profile-execution true --profile-name lab --profile-step-start 1 --profile-step-end 2 "
                  "--tensorboard-dir {}", dir / "tb")));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("step trace of iteration(s) 2: " + dir / "tb/lab.pt.trace.json"), std::string::npos)
      << run.output;
  const ParsedTrace trace = parse(read_json(dir / "tb/lab.pt.trace.json"));
  ASSERT_TRUE(trace.tracks.contains("trainer"));
  EXPECT_EQ(trace.tracks.at("trainer").front().name, "iteration 2");
}

TEST(StepTraceCli, ARunEndingBeforeTheWindowSaysSoAndMegatronsDefaultsApply) {
  const TempDir dir;
  const testing::CommandResult run = testing::run_kiln(tiny_train("--profile --profile-dir " + dir / "p"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(
      run.output.find("no step trace: the run ran no iteration of the traced ones, 11..12 (it ended at iteration 3)"),
      std::string::npos)
      << run.output;
}

TEST(StepTraceCli, BadSettingsStopTheRunBeforeItsFirstStep) {
  const TempDir dir;
  testing::write_file_bytes(dir / "a-file", "x");
  const std::pair<std::string, std::string> cases[] = {
      {"--profile", "config key 'profile' needs a folder for the trace: set 'profile_dir'"},
      {"--profile --profile-dir P --profile-ops", "config keys 'profile' and 'profile_ops' are both set"},
      {"--profile --profile-dir P --profile-step-start 5 --profile-step-end 5",
       "config keys 'profile_step_start' (5) and 'profile_step_end' (5)"},
      {"--profile --profile-dir P --profile-ranks 0,x", "config key 'profile_ranks': '0,x' is not a list of ranks"},
      {"--profile --profile-dir P --profile-ranks 0,", "config key 'profile_ranks': '0,' is not a list of ranks"},
      {"--profile --profile-dir P --profile-ranks 1", "config key 'profile_ranks' names rank 1, but the job has 1 ranks"},
      {"--profile --profile-dir " + dir / "a-file/p", "cannot create the trace folder '" + dir / "a-file/p" + "'"},
  };
  for (const auto& [flags, message] : cases) {
    SCOPED_TRACE(flags);
    const testing::CommandResult run = testing::run_kiln(tiny_train(flags));
    EXPECT_NE(run.exit_code, 0);
    EXPECT_NE(run.output.find(message), std::string::npos) << run.output;
    EXPECT_EQ(run.output.find("iteration        1/"), std::string::npos) << run.output;
  }
}

// tiny_train(flags) on two ranks over Gloo, under kiln launch.
testing::CommandResult train_on_two_ranks(const std::string& flags) {
  return testing::run_command(fmt::format("OMP_NUM_THREADS=1 {} launch --standalone --nproc-per-node 2 -- {} {}",
                                          testing::kiln_binary(), testing::kiln_binary(), tiny_train(flags)));
}

// Two ranks over Gloo, both traced (--profile-ranks all): each writes its own file, whose
// communication thread holds the collectives of the traced step.
TEST(StepTraceCli, EveryProfiledRankWritesItsTraceWithItsCommunicationThread) {
  const TempDir dir;
  const testing::CommandResult run =
      train_on_two_ranks(fmt::format("--global-batch-size 4 --profile --profile-ranks all --profile-step-start 1 "
                                     "--profile-step-end 2 --profile-name duo --profile-dir {}",
                                     dir / "p"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (int rank : {0, 1}) {
    SCOPED_TRACE(rank);
    const ParsedTrace trace = parse(read_json(dir / fmt::format("p/duo_rank{}.pt.trace.json", rank)));
    EXPECT_EQ(trace.process_name, fmt::format("kiln rank {}", rank));
    ASSERT_TRUE(trace.tracks.contains("communication (gloo)"));
    std::set<std::string> collectives;
    for (const Complete& event : trace.tracks.at("communication (gloo)")) {
      EXPECT_EQ(event.category, "communication");
      collectives.insert(event.name.substr(0, event.name.find(' ')));
    }
    EXPECT_TRUE(collectives.contains("all_reduce")) << collectives.size() << " kinds of collective";
    std::set<std::string> parts;
    for (const Complete& event : trace.tracks.at("trainer")) parts.insert(event.name);
    EXPECT_TRUE(parts.contains("gradient reduction (wait)"));
    EXPECT_TRUE(parts.contains("loss and reduce waits (over ranks)"));
  }
}

// ZeRO-1 over two ranks: the gradient buckets are reduced to the ranks owning their pieces (a
// reduce a piece, to both ranks over the step), not one reduce-scatter after the backward.
TEST(StepTraceCli, TheDistributedOptimizerReducesEachBucketToTheRanksThatOwnIt) {
  const TempDir dir;
  const testing::CommandResult run = train_on_two_ranks(
      fmt::format("--global-batch-size 4 --use-distributed-optimizer --ddp-bucket-size 400 --profile "
                  "--profile-step-start 1 --profile-step-end 2 --profile-name zero --profile-dir {}",
                  dir / "p"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const ParsedTrace trace = parse(read_json(dir / "p/zero_rank0.pt.trace.json"));
  ASSERT_TRUE(trace.tracks.contains("communication (gloo)"));
  std::set<std::string> roots;
  int reduces = 0;
  for (const Complete& event : trace.tracks.at("communication (gloo)")) {
    EXPECT_FALSE(event.name.starts_with("reduce_scatter")) << event.name;
    if (!event.name.starts_with("reduce (")) continue;
    ++reduces;
    roots.insert(event.name.substr(event.name.find("to rank")));
  }
  EXPECT_GT(reduces, 2);
  EXPECT_EQ(roots, (std::set<std::string>{"to rank 0)", "to rank 1)"}));
}

}  // namespace
}  // namespace kiln
