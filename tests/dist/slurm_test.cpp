// kiln under a real Slurm: a one-node cluster (support/slurm_cluster.h: munged, slurmctld and slurmd
// started by the test) runs `srun -n 2 kiln train ...` with no wrapper script, each task finding its
// place from SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_NODEID and
// SLURM_STEP_NODELIST, and the master port derived from SLURM_JOB_ID (dist/bootstrap.h). It must
// train what `kiln launch` trains with the same two ranks, to the bit. The test skips, naming the
// reason and the daemons' last log lines, where Slurm is not installed or its daemons cannot start.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "kiln/dist/worker_group.h"
#include "kiln/train/safetensors.h"
#include "support/kiln_process.h"
#include "support/slurm_cluster.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::CommandResult;
using testing::kiln_binary;
using testing::run_command;
using testing::SlurmCluster;
using testing::TempDir;

constexpr int kTrainIters = 4;

// A 2-layer GPT on random tokens, 4 steps of global batch 4 (2 ranks x micro-batch 2), validated
// every 2, saved at the end; buckets of 2000 elements, so the reduction overlaps the backward
// (tests/dist/data_parallel_test.cpp's tiny run).
std::string tiny_run(const std::string& save) {
  return fmt::format(
      "train --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --vocab-size 64 --mock-data "
      "--micro-batch-size 2 --global-batch-size 4 --train-iters {} --lr 1e-3 --eval-iters 2 --eval-interval 2 "
      "--log-interval 1 --num-workers 0 --ddp-bucket-size 2000 --distributed-timeout-minutes 0.5 --save {}",
      kTrainIters, save);
}

// The log's numbers: each iteration's loss, loss scale, gradient norm and skipped count and each
// validation loss, as printed (a rank prefix, if any, is not part of them).
std::vector<std::string> logged_numbers(const std::string& output) {
  static const std::regex number(R"((lm loss( value)?|loss scale|grad norm|skipped iterations): +([^ |]+))");
  std::vector<std::string> numbers;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), number); it != std::sregex_iterator(); ++it)
    numbers.push_back((*it)[1].str() + "=" + (*it)[3].str());
  return numbers;
}

size_t count_matches(const std::string& output, const std::string& pattern) {
  const std::regex expression(pattern);
  return static_cast<size_t>(
      std::distance(std::sregex_iterator(output.begin(), output.end(), expression), std::sregex_iterator()));
}

// Two safetensors files hold the same tensors with the same bytes.
void expect_same_tensors(const std::string& path_a, const std::string& path_b) {
  const SafetensorsFile a(path_a), b(path_b);
  ASSERT_EQ(a.entries().size(), b.entries().size());
  for (const auto& [name, entry] : a.entries()) {
    ASSERT_TRUE(b.contains(name)) << name;
    const SafetensorsEntry& other = b.get(name);
    EXPECT_EQ(entry.dtype, other.dtype) << name;
    ASSERT_EQ(entry.shape.numel(), other.shape.numel()) << name;
    const size_t bytes = static_cast<size_t>(entry.shape.numel()) * dtype_size(entry.dtype);
    EXPECT_EQ(std::memcmp(entry.data, other.data, bytes), 0) << name << " differs";
  }
}

// Submitting the example sbatch files as their comments say, from a folder holding the
// repository's examples/: `dir` gets a link to them.
void link_examples(const TempDir& dir) {
  const std::filesystem::path repository = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  std::filesystem::create_directory_symlink(repository / "examples", dir / "examples");
}

// What the jobs named `job_name` wrote: the example files append to kiln-<job name>-<job id>.out.
std::string job_output(const TempDir& dir, const std::string& job_name) {
  std::string text;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    if (entry.path().filename().string().starts_with("kiln-" + job_name + "-"))
      text += testing::read_file_bytes(entry.path().string());
  return text;
}

TEST(SlurmCluster, SrunTrainsTheSameBitsAsKilnLaunchWithNoWrapper) {
  const SlurmCluster cluster;
  if (!cluster.available()) GTEST_SKIP() << cluster.reason();
  const TempDir dir;

  // srun's tasks get no MASTER_PORT: it is derived from the job id (15000 + id % 10000).
  const CommandResult under_srun = run_command(fmt::format(
      "{}export OMP_NUM_THREADS=1; timeout -k 10 120 {} -n 2 --ntasks-per-node 2 --kill-on-bad-exit=1 {} {}",
      cluster.command_prefix(), cluster.srun(), kiln_binary(), tiny_run(dir / "A")));
  ASSERT_EQ(under_srun.exit_code, 0) << under_srun.output << "\n" << cluster.logs();

  const CommandResult under_launch = run_command(fmt::format(
      "{}export OMP_NUM_THREADS=1; timeout -k 10 120 {} launch --standalone --nproc-per-node 2 -- {} {}",
      cluster.command_prefix(), kiln_binary(), kiln_binary(), tiny_run(dir / "B")));
  ASSERT_EQ(under_launch.exit_code, 0) << under_launch.output;

  // The two tasks met as one job of two ranks...
  EXPECT_NE(under_srun.output.find("data-parallel 2 x accumulation 1 = global 4"), std::string::npos)
      << under_srun.output;
  // ...and rank 0 alone logged (srun merges both tasks' output).
  EXPECT_EQ(count_matches(under_srun.output, R"( iteration +[0-9]+/ +[0-9]+ \|)"), static_cast<size_t>(kTrainIters))
      << under_srun.output;
  EXPECT_EQ(count_matches(under_srun.output, "validation loss at iteration"), 2u) << under_srun.output;
  EXPECT_EQ(count_matches(under_srun.output, "saved checkpoint"), 1u) << under_srun.output;
  EXPECT_EQ(count_matches(under_srun.output, "model: GPT: 2 layers"), 1u) << under_srun.output;

  // The same ranks compute the same sums in the same order: the same bits.
  ASSERT_EQ(logged_numbers(under_srun.output).size(), 4u * kTrainIters + 2u) << under_srun.output;
  EXPECT_EQ(logged_numbers(under_srun.output), logged_numbers(under_launch.output))
      << under_srun.output << "\n" << under_launch.output;
  const std::string checkpoint = fmt::format("/iter_{:07d}/", kTrainIters);
  expect_same_tensors(dir / ("A" + checkpoint + "model.safetensors"), dir / ("B" + checkpoint + "model.safetensors"));
  expect_same_tensors(dir / ("A" + checkpoint + "optimizer.safetensors"),
                      dir / ("B" + checkpoint + "optimizer.safetensors"));
}

// examples/slurm/cpu-2x2.sbatch submitted as its comments say, from a folder holding the
// repository's examples/, on the one-node cluster: sbatch's own flags replace the file's layout
// (2 nodes x 2 tasks of 4 CPUs) with this node's 1 x 2 tasks of 1 CPU, and flags after the file's
// name make the run short. Submitted again (as a requeued job is), it resumes from the checkpoint
// the first job saved. The first job derives its MASTER_PORT from its id; the second exports a free
// one, as the file allows, rather than count on the next id's port being free.
TEST(SlurmCluster, TheCpuExampleSbatchFileTrainsAndItsResubmissionResumes) {
  const TempDir dir;  // outlives the cluster, whose end stops a job still writing into it
  const SlurmCluster cluster;
  if (!cluster.available()) GTEST_SKIP() << cluster.reason();
  link_examples(dir);
  const auto submit = [&](int train_iters, const std::string& exports) {
    return run_command(fmt::format(
        "{}cd {} && export KILN={} RUN={} {} && timeout -k 10 180 {} --wait --nodes=1 --ntasks-per-node=2 "
        "--cpus-per-task=1 examples/slurm/cpu-2x2.sbatch --mock-data --vocab-size 257 --train-iters {} "
        "--lr-warmup-iters 1 --eval-iters 1 --log-interval 1",
        cluster.command_prefix(), dir.path(), kiln_binary(), dir / "run", exports, cluster.sbatch(), train_iters));
  };

  const CommandResult first = submit(2, "");
  ASSERT_EQ(first.exit_code, 0) << first.output << "\n" << job_output(dir, "kiln-cpu") << "\n" << cluster.logs();
  const std::string first_output = job_output(dir, "kiln-cpu");
  EXPECT_NE(first_output.find("micro 4 x data-parallel 2 x accumulation 2 = global 16"), std::string::npos)
      << first_output;
  EXPECT_EQ(count_matches(first_output, R"( iteration +[0-9]+/ +2 \|)"), 2u) << first_output;
  EXPECT_EQ(count_matches(first_output, "saved checkpoint at iteration +2 "), 1u) << first_output;

  const CommandResult second = submit(4, fmt::format("MASTER_PORT={}", dist::find_free_port()));
  ASSERT_EQ(second.exit_code, 0) << second.output << "\n" << job_output(dir, "kiln-cpu") << "\n" << cluster.logs();
  const std::string both = job_output(dir, "kiln-cpu");
  EXPECT_EQ(count_matches(both, "resumed from .* at iteration 2 "), 1u) << both;
  EXPECT_EQ(count_matches(both, R"( iteration +[34]/ +4 \|)"), 2u) << both;
  EXPECT_EQ(count_matches(both, "saved checkpoint at iteration +4 "), 1u) << both;
}

// The GPU sbatch files (GPT-2 small, bf16, one task per GPU over NCCL) cannot run here, but all of
// their command lines but the device can: submitted with sbatch's own flags asking for no GPU and
// 2 tasks on this node, and told `--device cpu` after the file's name, each trains over Gloo from
// examples/gpt2-124m.yaml, made small by the flags after it (which win over the file's).
TEST(SlurmCluster, TheGpuExampleSbatchFilesTrainOnCpuTasksWhenTold) {
  const TempDir dir;  // outlives the cluster, whose end stops a job still writing into it
  const SlurmCluster cluster;
  if (!cluster.available()) GTEST_SKIP() << cluster.reason();
  link_examples(dir);
  for (const std::string file : {"gpt-2x2", "gpt-4x4"}) {
    SCOPED_TRACE(file);
    const CommandResult job = run_command(fmt::format(
        "{}cd {} && export KILN={} RUN={} MASTER_PORT={} && timeout -k 10 180 {} --wait --nodes=1 "
        "--ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 examples/slurm/{}.sbatch --device cpu --mock-data "
        "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 --vocab-size 257 "
        "--micro-batch-size 2 --global-batch-size 8 --train-iters 2 --lr-warmup-iters 1 --lr-decay-iters 2 "
        "--eval-iters 1 --log-interval 1",
        cluster.command_prefix(), dir.path(), kiln_binary(), dir / file, dist::find_free_port(), cluster.sbatch(),
        file));
    const std::string output = job_output(dir, "kiln-gpt2");
    ASSERT_EQ(job.exit_code, 0) << job.output << "\n" << output << "\n" << cluster.logs();
    EXPECT_NE(output.find("micro 2 x data-parallel 2 x accumulation 2 = global 8 | precision bf16 |"),
              std::string::npos)
        << output;
    EXPECT_EQ(count_matches(output, R"( iteration +[0-9]+/ +2 \|)"), 2u) << output;
    EXPECT_TRUE(std::filesystem::exists(dir / (file + "/iter_0000002/model.safetensors"))) << output;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path()))  // the next file's job alone
      if (entry.path().filename().string().starts_with("kiln-kiln-gpt2-")) std::filesystem::remove(entry.path());
  }
}

}  // namespace
}  // namespace kiln
