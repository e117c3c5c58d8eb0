// `kiln launch`: torchrun's job for kiln. Starts --nproc-per-node local copies of a command with
// torchrun's environment variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, and KILN_RESTART_COUNT with the same
// value), relays their output prefixed "[rank R] ", stops them all when one fails, and restarts
// the group up to --max-restarts times. The exit status is the failing worker's (128 + signal for
// a signal), so a scheduler sees what a shell running that worker would have seen.
#include <fmt/format.h>

#include <charconv>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kiln/cli/commands.h"
#include "kiln/core/error.h"
#include "kiln/dist/worker_group.h"

namespace kiln::cli {
namespace {

struct LaunchOptions {
  int nproc_per_node = 0;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool standalone = false;
  int max_restarts = 0;
  std::string log_ranks = "all";
  double monitor_interval = 0.1;
  std::vector<std::string> command;
  // Whether a flag was given at all, for the checks against --standalone.
  CLI::Option* master_addr_flag = nullptr;
  CLI::Option* master_port_flag = nullptr;
};

// "all" (empty: every rank) or a comma-separated list of global ranks.
std::vector<int> parse_log_ranks(const std::string& text, int world_size) {
  if (text == "all") return {};
  std::vector<int> ranks;
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(text.find(',', begin), text.size());
    int rank = -1;
    const auto [stop, error] = std::from_chars(text.data() + begin, text.data() + end, rank);
    KILN_CHECK(error == std::errc() && stop == text.data() + end && end > begin,
               "--log-ranks takes 'all' or ranks such as 0,2; got '{}'", text);
    KILN_CHECK(rank >= 0 && rank < world_size,
               "--log-ranks: rank {} is outside the world of {} (ranks 0 to {})", rank, world_size,
               world_size - 1);
    ranks.push_back(rank);
    if (end == text.size()) return ranks;
    begin = end + 1;
  }
}

void check(const LaunchOptions& options) {
  KILN_CHECK(!options.command.empty(),
             "kiln launch needs a COMMAND to run after --, e.g. kiln launch --nproc-per-node 2 -- "
             "kiln train --config run.yaml");
  KILN_CHECK(options.nproc_per_node >= 1, "--nproc-per-node must be >= 1, got {}",
             options.nproc_per_node);
  KILN_CHECK(options.nnodes >= 1, "--nnodes must be >= 1, got {}", options.nnodes);
  KILN_CHECK(options.node_rank >= 0 && options.node_rank < options.nnodes,
             "--node-rank must be in [0, --nnodes {}), got {}", options.nnodes, options.node_rank);
  KILN_CHECK(int64_t{options.nnodes} * options.nproc_per_node <= INT_MAX,
             "--nnodes {} x --nproc-per-node {} workers is too many", options.nnodes,
             options.nproc_per_node);
  KILN_CHECK(options.max_restarts >= 0, "--max-restarts must be >= 0, got {}",
             options.max_restarts);
  KILN_CHECK(options.monitor_interval > 0 && options.monitor_interval <= 3600,
             "--monitor-interval must be in (0, 3600] seconds, got {}", options.monitor_interval);
  if (options.standalone) {
    KILN_CHECK(options.nnodes == 1,
               "--standalone runs one node: it cannot be combined with --nnodes {}",
               options.nnodes);
    KILN_CHECK(options.master_port_flag->count() == 0,
               "--standalone picks a free port itself: it cannot be combined with --master-port");
    KILN_CHECK(options.master_addr_flag->count() == 0,
               "--standalone uses 127.0.0.1: it cannot be combined with --master-addr");
  } else {
    KILN_CHECK(options.master_port >= 1 && options.master_port <= 65535,
               "--master-port must be in [1, 65535], got {}", options.master_port);
    KILN_CHECK(!options.master_addr.empty(), "--master-addr must not be empty");
  }
}

dist::WorkerGroupOptions group_options(const LaunchOptions& options, const std::vector<int>& shown,
                                       int restart) {
  dist::WorkerGroupOptions group;
  group.command = options.command;
  group.shown_ranks = shown;
  group.monitor_interval_seconds = options.monitor_interval;
  // A fresh port each start: the last group's port may linger in TIME_WAIT or be taken by now.
  const int port = options.standalone ? dist::find_free_port() : options.master_port;
  const int world_size = options.nnodes * options.nproc_per_node;
  if (restart == 0)
    fmt::print(stderr, "kiln launch: {} worker{} on node {} of {}, world size {}, master {}:{}\n",
               options.nproc_per_node, options.nproc_per_node == 1 ? "" : "s", options.node_rank,
               options.nnodes, world_size, options.master_addr, port);
  if (restart == 0 && options.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr)
    fmt::print(stderr, "kiln launch: OMP_NUM_THREADS is not set: each worker gets 1 OpenMP thread (set it to "
                       "choose)\n");
  for (int local = 0; local < options.nproc_per_node; ++local) {
    dist::WorkerSpec worker;
    worker.rank = options.node_rank * options.nproc_per_node + local;
    worker.environment = {
        fmt::format("RANK={}", worker.rank),
        fmt::format("WORLD_SIZE={}", world_size),
        fmt::format("LOCAL_RANK={}", local),
        fmt::format("LOCAL_WORLD_SIZE={}", options.nproc_per_node),
        fmt::format("GROUP_RANK={}", options.node_rank),
        fmt::format("MASTER_ADDR={}", options.master_addr),
        fmt::format("MASTER_PORT={}", port),
        fmt::format("KILN_RESTART_COUNT={}", restart),
        fmt::format("TORCHELASTIC_RESTART_COUNT={}", restart),
    };
    // torchrun's rule: several workers on one node each get one OpenMP thread unless the user
    // says otherwise, so CPU ranks do not fight over the cores.
    if (options.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr)
      worker.environment.push_back("OMP_NUM_THREADS=1");
    group.workers.push_back(std::move(worker));
  }
  return group;
}

void launch(LaunchOptions& options) {
  check(options);
  if (options.standalone) options.master_addr = "127.0.0.1";
  const std::vector<int> shown =
      parse_log_ranks(options.log_ranks, options.nnodes * options.nproc_per_node);
  const int status = dist::run_with_restarts(
      options.max_restarts, [&](int restart) { return group_options(options, shown, restart); });
  // CLI11 turns a RuntimeError into main()'s return value without printing anything.
  if (status != 0) throw CLI::RuntimeError(status);
}

}  // namespace

void add_launch_command(CLI::App& root) {
  auto options = std::make_shared<LaunchOptions>();
  CLI::App* command = root.add_subcommand(
      "launch",
      "start and supervise local worker processes, as torchrun does: kiln launch "
      "--nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P | "
      "--standalone] -- COMMAND ARGS...");
  command->add_option("--nproc-per-node", options->nproc_per_node, "workers on this node")
      ->required();
  command->add_option("--nnodes", options->nnodes, "nodes in the job");
  command->add_option("--node-rank", options->node_rank, "this node's index, 0 to --nnodes - 1");
  options->master_addr_flag =
      command->add_option("--master-addr", options->master_addr, "address of rank 0's node");
  options->master_port_flag = command->add_option("--master-port", options->master_port,
                                                  "port of the rendezvous on rank 0's node");
  command->add_flag("--standalone", options->standalone,
                    "one node, master 127.0.0.1 on a free port (a fresh one each restart)");
  command->add_option("--max-restarts", options->max_restarts,
                      "times to start the whole group again after a worker fails");
  command->add_option("--log-ranks", options->log_ranks,
                      "whose output to show: all, or global ranks such as 0 or 0,2");
  command->add_option("--monitor-interval", options->monitor_interval,
                      "seconds between checks for exited workers");
  command->add_option("command", options->command, "the command each worker runs, after --");
  command->callback([options] { launch(*options); });
}

}  // namespace kiln::cli
