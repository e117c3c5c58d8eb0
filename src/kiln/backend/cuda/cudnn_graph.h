// A cuDNN operation graph built through the backend API (cudnn_api.h), and the execution plan
// cuDNN's heuristics choose for it. The graph is written op by op over tensors named by ids, as
// cuDNN's documentation lays out its fused patterns ("Graph API", cuDNN 9 developer guide):
//   - memory tensors: caller data, given a device pointer at each run;
//   - virtual tensors: intermediates of a fused engine, never in memory;
//   - by-value scalars: [1,1,1,1] fp32 values given by host pointer at each run.
// Every op's compute type is fp32 unless stated. A plan is made once per shape and run many times;
// running it needs the plan's workspace (workspace_bytes()) on the device.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "kiln/backend/cuda/cudnn_api.h"

namespace kiln::cudnn {

// One backend descriptor, destroyed with its owner. Set attributes, then finalize.
class BackendDescriptor {
 public:
  BackendDescriptor(DescriptorType type, std::string what);
  ~BackendDescriptor();
  BackendDescriptor(BackendDescriptor&& other) noexcept;
  BackendDescriptor& operator=(BackendDescriptor&&) = delete;
  BackendDescriptor(const BackendDescriptor&) = delete;
  BackendDescriptor& operator=(const BackendDescriptor&) = delete;

  BackendDescriptor& set(Attribute attribute, AttributeType type, int64_t count, const void* values);
  BackendDescriptor& set_int(Attribute attribute, int64_t value) {
    return set(attribute, AttributeType::Int64, 1, &value);
  }
  BackendDescriptor& set_ints(Attribute attribute, const std::vector<int64_t>& values) {
    return set(attribute, AttributeType::Int64, static_cast<int64_t>(values.size()), values.data());
  }
  BackendDescriptor& set_data_type(Attribute attribute, DataType type) {
    return set(attribute, AttributeType::DataType, 1, &type);
  }
  BackendDescriptor& set_descriptor(Attribute attribute, const BackendDescriptor& descriptor) {
    return set(attribute, AttributeType::Descriptor, 1, &descriptor.raw_);
  }
  void finalize();
  Descriptor raw() const { return raw_; }
  const std::string& what() const { return what_; }

 private:
  Descriptor raw_ = nullptr;
  std::string what_;
};

class Plan;

struct TensorLayout {
  std::vector<int64_t> dims, strides;  // 4 each
  DataType type;
};

class OperationGraph {
 public:
  using Id = int64_t;
  explicit OperationGraph(std::string what) : what_(std::move(what)) {}

  Id memory_tensor(const TensorLayout& layout);   // 16-byte aligned data
  Id virtual_tensor(const TensorLayout& layout);
  Id scalar();                                    // fp32, by value

  // out = mode(inputs...): one input (Exp, Log, Identity, GenerateIndex along `axis`), two, or three
  // (BinarySelect: inputs[2] ? inputs[0] : inputs[1]).
  void pointwise(PointwiseMode mode, std::initializer_list<Id> inputs, Id out, DataType compute = DataType::Float,
                 int64_t axis = -1);
  void reduction(ReductionOperator op, Id in, Id out);  // over the axes where out's dims are 1
  void matmul(Id a, Id b, Id c);                        // batched over the leading dims
  void reshape(Id in, Id out);                          // the same elements seen through out's layout

  // The plan for `handle`: the first of cuDNN's heuristic (mode A, then fallback) configurations
  // that finalizes. A kiln::Error with cuDNN's reason if none does: from cuDNN 9.8, each engine's
  // answer for this GPU (cudnn_device.h).
  Plan build(Handle handle) const;

  // The graph's descriptor, finalized for `handle`'s device; with no handle, for a GPU described by
  // DeviceProperties (cudnn_device.h).
  BackendDescriptor finalized(Handle handle) const;

 private:
  static constexpr Id kFirstId = 1;
  Id add_tensor(const TensorLayout& layout, bool is_virtual, bool by_value);
  const BackendDescriptor& tensor(Id id) const { return tensors_.at(static_cast<size_t>(id - kFirstId)); }

  std::string what_;
  std::vector<BackendDescriptor> tensors_;  // by id - kFirstId
  std::vector<BackendDescriptor> operations_, op_descriptors_;
};

// A finalized execution plan, holding the graph and the engine configuration it was made from;
// run() binds each memory tensor id to its device pointer and each scalar id to a host pointer to
// its value.
class Plan {
 public:
  Plan(BackendDescriptor graph, BackendDescriptor config, BackendDescriptor plan, int64_t workspace_bytes,
       std::string what)
      : graph_(std::move(graph)),
        config_(std::move(config)),
        plan_(std::move(plan)),
        workspace_bytes_(workspace_bytes),
        what_(std::move(what)) {}
  int64_t workspace_bytes() const { return workspace_bytes_; }
  void run(Handle handle, const std::vector<std::pair<OperationGraph::Id, void*>>& bindings, void* workspace) const;

 private:
  BackendDescriptor graph_, config_, plan_;
  int64_t workspace_bytes_;
  std::string what_;
};

}  // namespace kiln::cudnn
