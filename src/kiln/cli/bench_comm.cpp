// `kiln bench comm`: nccl-tests' table for kiln's own Communicator (dist/communicator.h). Every
// rank of a job runs it (under `kiln launch`, torchrun or srun; alone it measures the
// single-process communicator). For each op of --ops and each size from -b to -e, multiplied by -f
// each step, it checks one operation against values known in advance, runs the warm-up, then times
// --iters operations, each issued and waited for, after a barrier. Rank 0 prints one row per (op,
// size); the time is the slowest rank's mean, so the table is the job's, as nccl-tests reports it.
//
// Bandwidths follow nccl-tests' doc/PERFORMANCE.md (NVIDIA/nccl-tests): algbw = size / time, and
// busbw = algbw x a factor per op that makes the number comparable with the links' bandwidth
// whatever the rank count: all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n (their size
// being the whole buffer of n shards), reduce and broadcast 1 (reduce: to rank 0, what ZeRO-1's
// gradient buckets do to each shard's owner).
// Every operation is in place on fp32 buffers, as the Trainer's are: host memory for gloo (and a
// process alone), this rank's GPU memory for nccl (checked through a copy to the host). Gloo's
// reduce_scatter is an all-reduce of the whole buffer (gloo_communicator.cpp), so its busbw is
// about half what a true reduce-scatter reaches: the table measures the Communicator as it is.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kiln/backend/registry.h"
#include "kiln/cli/commands.h"
#include "kiln/core/error.h"
#include "kiln/dist/bootstrap.h"
#include "kiln/dist/communicator.h"
#include "kiln/dist/process_group.h"

namespace kiln::cli {
namespace {

// One measured collective: how to issue it, what the table says about it, what it must leave.
struct CommOp {
  std::string_view name;
  std::string_view redop;  // "sum", or "none" where nothing is reduced
  int root;                // -1 where there is none
  bool sharded;            // the buffer is world-size equal shards
  // What the op leaves where the check looks: the sum over ranks everywhere; the sum in this
  // rank's own shard only (the rest is undefined); the sum on root only (undefined elsewhere);
  // every shard its owner's values; root's values.
  enum class Leaves { Sum, SumInOwnShard, SumAtRoot, OwnersShards, RootsValues } leaves;
  double (*bus_factor)(int ranks);
  std::unique_ptr<CommWork> (*issue)(Communicator& comm, Tensor data);
};

// The value rank r puts at element i before the check: an integer in 1..31, so the sum over up to
// 500 000 ranks is exact in fp32 and depends on i only through i % 31. Rank and index both enter,
// so a shard from the wrong rank or the wrong place shows.
constexpr int kPeriod = 31;
float pattern(int rank, int64_t i) {
  return static_cast<float>((i % kPeriod * 7 + rank % kPeriod * 13) % kPeriod + 1);
}

constexpr std::array<CommOp, 5> kOps = {{
    {"all_reduce", "sum", -1, false, CommOp::Leaves::Sum, [](int n) { return 2.0 * (n - 1) / n; },
     [](Communicator& comm, Tensor data) { return comm.all_reduce(data, ReduceOp::Sum); }},
    {"all_gather", "none", -1, true, CommOp::Leaves::OwnersShards,
     [](int n) { return static_cast<double>(n - 1) / n; },
     [](Communicator& comm, Tensor data) { return comm.all_gather(data); }},
    {"reduce_scatter", "sum", -1, true, CommOp::Leaves::SumInOwnShard,
     [](int n) { return static_cast<double>(n - 1) / n; },
     [](Communicator& comm, Tensor data) { return comm.reduce_scatter(data); }},
    {"reduce", "sum", 0, false, CommOp::Leaves::SumAtRoot, [](int) { return 1.0; },
     [](Communicator& comm, Tensor data) { return comm.reduce(data, 0); }},
    {"broadcast", "none", 0, false, CommOp::Leaves::RootsValues, [](int) { return 1.0; },
     [](Communicator& comm, Tensor data) { return comm.broadcast(data, 0); }},
}};

std::string op_names() {
  std::string names;
  for (const CommOp& op : kOps) names += (names.empty() ? "" : ", ") + std::string(op.name);
  return names;
}

struct BenchCommOptions {
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "reduce", "broadcast"};
  std::string min_bytes = "8", max_bytes = "256M";
  int64_t step_factor = 2;
  int64_t iters = 20, warmup_iters = 5;
  int check = 1;
  bool json = false;
  std::string backend = "gloo";
  double timeout_minutes = 10;
  int corrupt_rank = -1;
};

// "8", "64K", "256M", "1G" (powers of 1024) as bytes; errors name the flag.
int64_t parse_bytes(const std::string& text, std::string_view flag) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  int shift = 0;
  if (error == std::errc() && stop + 1 == end) {
    const char suffix = static_cast<char>(std::toupper(static_cast<unsigned char>(*stop)));
    shift = suffix == 'K' ? 10 : suffix == 'M' ? 20 : suffix == 'G' ? 30 : -1;
  }
  KILN_CHECK(error == std::errc() && stop != text.data() && (stop == end || shift > 0),
             "{} '{}' is not a size in bytes (digits, optionally followed by K, M or G)", flag,
             text);
  KILN_CHECK(value > 0, "{} must be a positive size in bytes, got '{}'", flag, text);
  KILN_CHECK(value <= (INT64_C(1) << 50) >> shift, "{} '{}' is too large", flag, text);
  return value << shift;
}

struct Plan {
  std::vector<const CommOp*> ops;
  std::vector<int64_t> sizes;  // bytes asked for; each op's rows print the bytes it used
};

// Checks every flag (before any rank joins, so all stop alike) and lists what to measure.
Plan make_plan(const BenchCommOptions& o) {
  Plan plan;
  KILN_CHECK(!o.ops.empty(), "--ops needs at least one of {}", op_names());
  for (const std::string& name : o.ops) {
    const auto op =
        std::find_if(kOps.begin(), kOps.end(), [&](const CommOp& c) { return c.name == name; });
    KILN_CHECK(op != kOps.end(), "--ops: '{}' is not one of {}", name, op_names());
    plan.ops.push_back(&*op);
  }
  const int64_t min_bytes = parse_bytes(o.min_bytes, "-b/--minbytes");
  const int64_t max_bytes = parse_bytes(o.max_bytes, "-e/--maxbytes");
  KILN_CHECK(min_bytes <= max_bytes, "-b/--minbytes {} is larger than -e/--maxbytes {}",
             o.min_bytes, o.max_bytes);
  KILN_CHECK(o.step_factor >= 2, "-f/--stepfactor must be at least 2, got {}", o.step_factor);
  KILN_CHECK(o.iters > 0, "-n/--iters must be positive, got {}", o.iters);
  KILN_CHECK(o.warmup_iters >= 0, "-w/--warmup-iters must be >= 0, got {}", o.warmup_iters);
  KILN_CHECK(o.check == 0 || o.check == 1, "-c/--check takes 1 or 0, got {}", o.check);
  KILN_CHECK(o.backend == "gloo" || o.backend == "nccl",
             "--distributed-backend '{}' is not gloo or nccl", o.backend);
  KILN_CHECK(o.timeout_minutes > 0, "--distributed-timeout-minutes must be positive, got {}",
             o.timeout_minutes);
  KILN_CHECK(o.corrupt_rank >= -1, "--corrupt-rank must be a rank (or -1: none), got {}",
             o.corrupt_rank);
  for (int64_t size = min_bytes;; size *= o.step_factor) {
    plan.sizes.push_back(size);
    if (size > max_bytes / o.step_factor) break;
  }
  return plan;
}

// The bench's own options as YAML, one key a line, so ranks started with different ones stop at
// check_same_configuration naming the flag.
std::string options_yaml(const BenchCommOptions& o) {
  std::string yaml = "bench: comm\n";
  yaml += fmt::format("--ops: {}\n--minbytes: {}\n--maxbytes: {}\n--stepfactor: {}\n",
                      fmt::join(o.ops, ","), o.min_bytes, o.max_bytes, o.step_factor);
  yaml += fmt::format("--iters: {}\n--warmup-iters: {}\n--check: {}\n--json: {}\n", o.iters,
                      o.warmup_iters, o.check, o.json);
  yaml += fmt::format("--distributed-backend: {}\n--distributed-timeout-minutes: {}\n", o.backend,
                      o.timeout_minutes);
  return yaml + fmt::format("--corrupt-rank: {}\n", o.corrupt_rank);
}

// fp32 elements for `bytes`: at least one, and for sharded ops a multiple of the world size (equal
// shards) and at least one element a rank.
int64_t element_count(const CommOp& op, int64_t bytes, int ranks) {
  const int64_t count = std::max<int64_t>(bytes / 4, 1);
  return op.sharded ? std::max<int64_t>(count / ranks * ranks, ranks) : count;
}

// "rank 0: pid 1234 on host vm, 8 CPUs", for every rank, exchanged through the rendezvous store
// (rank 0 is the only reader).
std::vector<std::string> rank_descriptions(const ProcessPlace& place, ProcessGroup* group) {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "?");
  const std::string mine = fmt::format("rank {}: pid {} on host {}, {} CPUs", place.rank,
                                       ::getpid(), host, std::thread::hardware_concurrency());
  if (!group) return {mine};
  group->store->set("bench_comm/rank/" + std::to_string(place.rank), {mine.begin(), mine.end()});
  std::vector<std::string> all;
  if (place.rank == 0)
    for (int rank = 0; rank < place.world_size; ++rank) {
      const std::vector<char> theirs = group->store->get("bench_comm/rank/" + std::to_string(rank));
      all.emplace_back(theirs.begin(), theirs.end());
    }
  return all;
}

// The measured buffer: host memory, or with `on_gpu` the CUDA back-end's memory on this rank's GPU,
// filled and read through the host copy.
class BenchBuffer {
 public:
  BenchBuffer(int64_t elements, bool on_gpu, int device_index) {
    try {
      host_.resize(static_cast<size_t>(elements));
    } catch (const std::bad_alloc&) {
      fail("-e/--maxbytes: cannot allocate {} bytes of host memory", elements * 4);
    }
    if (!on_gpu) return;
    BackendOptions options;
    options.device_index = device_index;
    gpu_ = make_backend("cuda", options);
    device_ = gpu_->allocate(host_.size() * sizeof(float));
  }
  std::span<float> host(int64_t count) { return std::span<float>(host_).first(static_cast<size_t>(count)); }
  Tensor tensor(int64_t count) const {
    return {gpu_ ? device_->data() : const_cast<float*>(host_.data()), Shape{count}, DType::F32,
            gpu_ ? Device::CUDA : Device::CPU};
  }
  void to_device(int64_t count) {
    if (gpu_) gpu_->copy_to_device(device_->data(), host_.data(), static_cast<size_t>(count) * sizeof(float));
  }
  void to_host(int64_t count) {
    if (gpu_) gpu_->copy_to_host(host_.data(), device_->data(), static_cast<size_t>(count) * sizeof(float));
  }

 private:
  std::vector<float> host_;
  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<DeviceBuffer> device_;
};

struct Row {
  const CommOp* op = nullptr;
  int64_t count = 0;
  double time_us = 0, algbw = 0, busbw = 0;  // GB/s: 1e9 bytes a second
  std::vector<double> wrong_by_rank;         // empty with --check 0
  int64_t bytes() const { return count * static_cast<int64_t>(sizeof(float)); }
  int64_t wrong() const {
    double total = 0;
    for (double w : wrong_by_rank) total += w;
    return static_cast<int64_t>(total);
  }
};

// Fills `data` with this rank's pattern (plus --corrupt-rank's one wrong element), runs `op` once
// and counts the elements that differ from what the op must leave on this rank.
int64_t check_once(Communicator& comm, const CommOp& op, BenchBuffer& buffer, int64_t count, int corrupt_rank) {
  const int rank = comm.rank(), ranks = comm.world_size();
  const std::span<float> data = buffer.host(count);
  const int64_t shard = op.sharded ? count / ranks : count;
  for (int64_t i = 0; i < count; ++i) data[static_cast<size_t>(i)] = pattern(rank, i);
  // In the rank's own shard, the only part an all_gather reads.
  if (rank == corrupt_rank) data[static_cast<size_t>(op.sharded ? rank * shard : 0)] += 1.0f;
  buffer.to_device(count);
  op.issue(comm, buffer.tensor(count))->wait();
  buffer.to_host(count);

  std::array<float, kPeriod> sums{};  // sum over the ranks of pattern(r, i), by i % kPeriod
  for (int p = 0; p < kPeriod; ++p)
    for (int r = 0; r < ranks; ++r) sums[static_cast<size_t>(p)] += pattern(r, p);
  using Leaves = CommOp::Leaves;
  const int64_t first = op.leaves == Leaves::SumInOwnShard ? rank * shard : 0;
  const int64_t last = op.leaves == Leaves::SumInOwnShard                     ? first + shard
                       : op.leaves == Leaves::SumAtRoot && rank != op.root ? first
                                                                           : count;
  int64_t wrong = 0;
  for (int64_t i = first; i < last; ++i) {
    const float expected =
        op.leaves == Leaves::OwnersShards  ? pattern(static_cast<int>(i / shard), i)
        : op.leaves == Leaves::RootsValues ? pattern(op.root, i)
                                           : sums[static_cast<size_t>(i % kPeriod)];
    wrong += data[static_cast<size_t>(i)] != expected;
  }
  return wrong;
}

Row measure(Communicator& comm, const CommOp& op, int64_t count, BenchBuffer& buffer,
            const BenchCommOptions& o) {
  Row row;
  row.op = &op;
  row.count = count;
  if (o.check) {
    row.wrong_by_rank.assign(static_cast<size_t>(comm.world_size()), 0.0);
    row.wrong_by_rank[static_cast<size_t>(comm.rank())] =
        static_cast<double>(check_once(comm, op, buffer, count, o.corrupt_rank));
  }
  // The timed operations sum into what the previous ones left: zeros cannot grow to infinity.
  const std::span<float> data = buffer.host(count);
  std::fill(data.begin(), data.end(), 0.0f);
  buffer.to_device(count);
  const Tensor tensor = buffer.tensor(count);
  for (int64_t i = 0; i < o.warmup_iters; ++i) op.issue(comm, tensor)->wait();
  comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.iters; ++i) op.issue(comm, tensor)->wait();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::array<double, 1> mean_us{seconds * 1e6 / static_cast<double>(o.iters)};
  comm.all_reduce_host(mean_us, ReduceOp::Max);
  if (o.check) comm.all_reduce_host(row.wrong_by_rank, ReduceOp::Sum);
  row.time_us = mean_us[0];
  row.algbw = row.time_us > 0 ? static_cast<double>(row.bytes()) / (row.time_us * 1e3) : 0.0;
  row.busbw = row.algbw * op.bus_factor(comm.world_size());
  return row;
}

constexpr std::string_view kColumns =
    "{:>15} {:>12} {:>12} {:>6} {:>6} {:>5} {:>11} {:>9} {:>9} {:>7}";

void print_header(const Communicator& comm, const BenchCommOptions& o, const ProcessPlace& place,
                  const std::vector<std::string>& ranks) {
  fmt::print(
      "# kiln bench comm | {} | {} rank{} ({}) | float, in place "
      "| sizes {} to {} bytes, x{} a step "
      "| {} iterations after {} warm-up; time: the slowest rank's mean | check {}\n",
      comm.name(), comm.world_size(), comm.world_size() == 1 ? "" : "s", place.source, o.min_bytes,
      o.max_bytes, o.step_factor, o.iters, o.warmup_iters, o.check ? "on" : "off");
  for (const std::string& rank : ranks) fmt::print("#   {}\n", rank);
  fmt::print(fmt::runtime("#" + std::string(kColumns) + "\n"), "op", "size", "count", "type",
             "redop", "root", "time", "algbw", "busbw", "#wrong");
  fmt::print(fmt::runtime("#" + std::string(kColumns) + "\n"), "", "(B)", "(elements)", "", "", "",
             "(us)", "(GB/s)", "(GB/s)", "");
  std::fflush(stdout);
}

void print_row(const Row& row) {
  fmt::print(" {:>15} {:>12} {:>12} {:>6} {:>6} {:>5} {:>11.2f} {:>9.2f} {:>9.2f} {:>7}\n",
             row.op->name, row.bytes(), row.count, "float", row.op->redop, row.op->root,
             row.time_us, row.algbw, row.busbw,
             row.wrong_by_rank.empty() ? "N/A" : std::to_string(row.wrong()));
  std::fflush(stdout);
}

nlohmann::json json_document(const Communicator& comm, const BenchCommOptions& o,
                             const std::vector<std::string>& ranks, const std::vector<Row>& rows,
                             double average_busbw, int64_t wrong) {
  nlohmann::json out = {{"bench", "comm"},
                        {"backend", comm.name()},
                        {"world_size", comm.world_size()},
                        {"ranks", ranks},
                        {"type", "float"},
                        {"iters", o.iters},
                        {"warmup_iters", o.warmup_iters},
                        {"check", o.check == 1},
                        {"avg_busbw_gbps", average_busbw}};
  out["wrong"] = o.check ? nlohmann::json(wrong) : nlohmann::json(nullptr);
  out["rows"] = nlohmann::json::array();
  for (const Row& row : rows)
    out["rows"].push_back({{"op", row.op->name},
                           {"size", row.bytes()},
                           {"count", row.count},
                           {"type", "float"},
                           {"redop", row.op->redop},
                           {"root", row.op->root},
                           {"time_us", row.time_us},
                           {"algbw_gbps", row.algbw},
                           {"busbw_gbps", row.busbw},
                           {"wrong", row.wrong_by_rank.empty() ? nlohmann::json(nullptr)
                                                               : nlohmann::json(row.wrong())}});
  return out;
}

void bench_comm(const BenchCommOptions& o) {
  const Plan plan = make_plan(o);
  const ProcessPlace place = find_process_place(process_environment());
  KILN_CHECK(o.corrupt_rank < place.world_size,
             "--corrupt-rank {} is outside the world of {} rank(s)", o.corrupt_rank,
             place.world_size);
  std::unique_ptr<ProcessGroup> group;
  SingleProcessCommunicator single_process;
  if (place.joins_group())
    group = join_process_group(
        place, o.backend,
        std::chrono::milliseconds(static_cast<int64_t>(o.timeout_minutes * 60'000.0)),
        options_yaml(o));
  Communicator& comm = group ? *group->communicator : single_process;
  const int ranks = comm.world_size();
  const std::vector<std::string> descriptions = rank_descriptions(place, group.get());

  int64_t largest = 1;
  for (const CommOp* op : plan.ops)
    largest = std::max(largest, element_count(*op, plan.sizes.back(), ranks));
  BenchBuffer buffer(largest, comm.name() == "nccl", place.local_rank);

  const bool printing = comm.rank() == 0;
  if (printing && !o.json) print_header(comm, o, place, descriptions);
  std::vector<Row> rows;
  for (const CommOp* op : plan.ops)
    for (const int64_t size : plan.sizes) {
      rows.push_back(measure(comm, *op, element_count(*op, size, ranks), buffer, o));
      if (printing && !o.json) print_row(rows.back());
    }

  double busbw_sum = 0;
  int64_t wrong = 0;
  const Row* first_wrong = nullptr;
  for (const Row& row : rows) {
    busbw_sum += row.busbw;
    wrong += row.wrong();
    if (!first_wrong && row.wrong() > 0) first_wrong = &row;
  }
  const double average_busbw = busbw_sum / static_cast<double>(rows.size());
  if (printing) {
    if (o.json) {
      fmt::print("{}\n", json_document(comm, o, descriptions, rows, average_busbw, wrong).dump());
    } else {
      fmt::print("# Avg bus bandwidth    : {:.3f}\n", average_busbw);
      fmt::print("# Wrong values: {}\n", o.check ? std::to_string(wrong) : "N/A (--check 0)");
    }
    std::fflush(stdout);
  }
  // Every rank knows the verdict; none exits before rank 0 has printed (a launcher ends the others
  // when one fails).
  comm.barrier();
  if (first_wrong) {
    const auto culprit =
        std::find_if(first_wrong->wrong_by_rank.begin(), first_wrong->wrong_by_rank.end(),
                     [](double w) { return w > 0; });
    fail("kiln bench comm: {} wrong values (first: {} at size {} on rank {})", wrong,
         first_wrong->op->name, first_wrong->bytes(), culprit - first_wrong->wrong_by_rank.begin());
  }
}

}  // namespace

void add_bench_comm_command(CLI::App& bench) {
  auto o = std::make_shared<BenchCommOptions>();
  CLI::App* comm = bench.add_subcommand(
      "comm",
      "time the Communicator's collectives, nccl-tests style (run it on every rank of a job)");
  comm->add_option("--ops", o->ops,
                   "collectives to measure: all_reduce, all_gather, reduce_scatter, reduce, broadcast")
      ->delimiter(',');
  comm->add_option("-b,--minbytes", o->min_bytes,
                   "smallest size in bytes (K, M, G: powers of 1024)");
  comm->add_option("-e,--maxbytes", o->max_bytes,
                   "largest size in bytes (K, M, G: powers of 1024)");
  comm->add_option("-f,--stepfactor", o->step_factor, "each size is the previous one times this");
  comm->add_option("-n,--iters", o->iters, "timed operations per size (their mean is reported)");
  comm->add_option("-w,--warmup-iters", o->warmup_iters,
                   "untimed operations per size before timing");
  comm->add_option("-c,--check", o->check,
                   "1: check each size's result against known values first; 0: don't");
  comm->add_flag("--json", o->json, "one JSON document instead of the table");
  comm->add_option("--distributed-backend", o->backend, "gloo (CPU ranks) or nccl (GPU ranks)");
  comm->add_option("--distributed-timeout-minutes", o->timeout_minutes,
                   "the longest wait on another rank");
  comm->add_option("--corrupt-rank", o->corrupt_rank,
                   "for tests: this rank adds 1 to one element of its input before the check");
  comm->callback([o] { bench_comm(*o); });
}

}  // namespace kiln::cli
