// MicroBatchGraphs: a training micro-batch's forward and backward replayed from a recorded graph
// (Backend::capture; the `cuda_graph` switch), so that its several hundred kernel launches cost
// the host one launch. The ops of a Model's forward_ops() and backward() read the micro-batch
// through device addresses fixed by begin_forward() (the stager slot the batch is in), a
// gradient scale (the loss scale over the counted positions) and whether the backward writes the
// gradients or adds to them (a step's first micro-batch or a later one); a graph recorded with one
// set of those (ForwardInputs) replays correctly for every micro-batch that has the same, so
// one graph is kept per set, a few at most: one per stager slot and gradient pass, and again when
// fp16's dynamic loss scale or the count of ignored targets changes the scale.
//
// The first call of each gradient pass runs the ops directly: it lets every op settle what it must
// do outside a capture (grow its workspace, plan its cuBLASLt products, raise kernels' shared-memory
// limits), and the two passes' ops differ there (a written bias gradient goes straight into the
// gradients, an added one through the workspace: other cuBLASLt plans). Where the back-end has no
// graphs (the CPU) every call runs the ops directly.
// Must not outlive the back-end or the model. Not thread-safe.
#pragma once

#include <memory>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/nn/model.h"

namespace kiln {

class MicroBatchGraphs {
 public:
  explicit MicroBatchGraphs(Backend& backend) : backend_(backend) {}

  // Issues model.forward_ops() then model.backward(), as recorded or directly; call after
  // model.begin_forward(..., a gradient pass, ...), before model.loss().
  void forward_backward(Model& model);

 private:
  // Graphs kept: enough for two stager slots, both gradient passes, at two gradient scales.
  static constexpr size_t kMaxGraphs = 8;
  struct Recorded {
    ForwardInputs inputs;
    std::unique_ptr<OpGraph> graph;
  };

  Backend& backend_;
  std::vector<GradientPass> warmed_up_;  // passes whose first call has run directly
  bool has_graphs_ = true;
  std::vector<Recorded> recorded_;  // least recently used first
};

}  // namespace kiln
