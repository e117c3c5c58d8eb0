#include "kiln/train/micro_batch_graphs.h"

#include <algorithm>

namespace kiln {

void MicroBatchGraphs::forward_backward(Model& model) {
  const auto ops = [&model] {
    model.forward_ops();
    model.backward();
  };
  const ForwardInputs& inputs = model.forward_inputs();
  const bool warmed_up = std::find(warmed_up_.begin(), warmed_up_.end(), inputs.gradients) != warmed_up_.end();
  if (!warmed_up || !has_graphs_) {
    ops();
    if (!warmed_up) warmed_up_.push_back(inputs.gradients);
    return;
  }
  auto found = std::find_if(recorded_.begin(), recorded_.end(),
                            [&](const Recorded& recorded) { return recorded.inputs == inputs; });
  if (found == recorded_.end()) {
    std::unique_ptr<OpGraph> graph = backend_.capture(ops);
    if (!graph) {  // the back-end has no graphs: nothing was recorded or run
      has_graphs_ = false;
      ops();
      return;
    }
    if (recorded_.size() == kMaxGraphs) recorded_.erase(recorded_.begin());
    recorded_.push_back({inputs, std::move(graph)});
    found = recorded_.end() - 1;
  } else {
    std::rotate(found, found + 1, recorded_.end());  // most recently used last
    found = recorded_.end() - 1;
  }
  found->graph->replay();
}

}  // namespace kiln
