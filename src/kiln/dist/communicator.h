// Communicator: the collectives of a data-parallel group over flat buffers (ARCHITECTURE.md,
// dist/). The Trainer owns one and is its only user; layers never see it. Three implementations
// sit behind it: a single process (world size 1: every operation is a no-op), Gloo (CPU ranks,
// gloo_communicator.h) and NCCL (GPU ranks). The engines move the bytes; kiln writes no
// collective algorithm of its own.
//
// Ordering: every rank must issue the same operations in the same order (the usual contract of
// MPI, NCCL and Gloo). An operation reads its buffer only after all work already queued on the
// owning back-end's compute stream (the CPU back-end runs each op as it is called; NCCL waits on
// an event of the compute stream), so a caller may issue it right after the op that produced the
// data, without any device-wide wait.
// Asynchrony: the tensor operations return at once with a CommWork; the buffer must stay
// untouched until its wait() returns. Operations complete in the order they were issued.
// Failure: a lost peer, a timeout or an engine error makes wait() (or the blocking calls) throw a
// kiln::Error that names the operation and what the engine said; the communicator is then
// unusable and the run must end.
// Thread-safety: one thread issues operations (the Trainer's); CommWork::wait may be called from it.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kiln/core/tensor.h"

namespace kiln {

class CommWork {
 public:
  virtual ~CommWork() = default;
  // Blocks until the operation is complete; rethrows its failure. Idempotent.
  virtual void wait() = 0;
};

enum class ReduceOp : uint8_t { Sum, Max };

// Asked by an engine's communicator after an operation fails, for the ranks to blame in its error
// (process_group.h, lost_ranks): e.g. "lost rank 1", "" when it cannot tell. `peer_fault`: the
// failure may come from another rank (a timeout, a closed or reset connection, NCCL's remote or
// system error); false when it is this rank's own (a CUDA error, a misuse), which blames nobody
// else.
using FailureExplainer = std::function<std::string(bool peer_fault)>;

// An all-reduce (sum, in place) bound to one buffer for the whole run and started many times (a
// gradient bucket, every step). Where the engine can set it up once, each start costs less than a
// one-off all_reduce (Gloo: a persistent algorithm, with its peers' buffers registered once).
class PreparedAllReduce {
 public:
  virtual ~PreparedAllReduce() = default;
  // As all_reduce(data, ReduceOp::Sum) on the prepared buffer, under the same contract.
  virtual std::unique_ptr<CommWork> start() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;  // "gloo", "nccl", "single process"

  // In place: `data` (fp32) becomes the element-wise reduction over all ranks, the same bits on
  // every rank.
  virtual std::unique_ptr<CommWork> all_reduce(Tensor data, ReduceOp op = ReduceOp::Sum) = 0;
  // `data` (fp32, numel divisible by world size) is world_size equal shards: shard r of rank r
  // becomes the sum over ranks of shard r; the other shards are left undefined (Gloo's sums them
  // all, NCCL's leaves them as they were).
  virtual std::unique_ptr<CommWork> reduce_scatter(Tensor data) = 0;
  // Sets up all_reduce(data, Sum) for repeated starts. Preparing is itself an operation: every rank
  // prepares the same buffers in the same order among its other operations. By default each start
  // is a one-off all_reduce.
  virtual std::unique_ptr<PreparedAllReduce> prepare_all_reduce(Tensor data);
  // `data` (fp32): root's becomes the sum over ranks; the other ranks' is left undefined (the
  // distributed optimizer's gradient buckets: each piece of a bucket goes to the rank that owns it).
  virtual std::unique_ptr<CommWork> reduce(Tensor data, int root) = 0;
  // `data` (any dtype, numel divisible by world size) is world_size equal shards: every rank's
  // shard r becomes rank r's shard r.
  virtual std::unique_ptr<CommWork> all_gather(Tensor data) = 0;
  // Every rank's `data` becomes root's.
  virtual std::unique_ptr<CommWork> broadcast(Tensor data, int root) = 0;

  // Blocking: returns when every rank has entered.
  virtual void barrier() = 0;
  // Blocking, on host memory: a few scalars (losses, a sum of squares, an overflow flag) reduced
  // over the ranks, the same bits on every rank.
  virtual void all_reduce_host(std::span<double> values, ReduceOp op = ReduceOp::Sum) = 0;
};

// World size 1: each operation leaves its buffer as it is (the reduction over one rank).
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string name() const override { return "single process"; }
  std::unique_ptr<CommWork> all_reduce(Tensor, ReduceOp) override { return done(); }
  std::unique_ptr<CommWork> reduce_scatter(Tensor) override { return done(); }
  std::unique_ptr<CommWork> reduce(Tensor, int) override { return done(); }
  std::unique_ptr<CommWork> all_gather(Tensor) override { return done(); }
  std::unique_ptr<CommWork> broadcast(Tensor, int) override { return done(); }
  void barrier() override {}
  void all_reduce_host(std::span<double>, ReduceOp) override {}

 private:
  struct Done final : CommWork {
    void wait() override {}
  };
  static std::unique_ptr<CommWork> done() { return std::make_unique<Done>(); }
};

}  // namespace kiln
