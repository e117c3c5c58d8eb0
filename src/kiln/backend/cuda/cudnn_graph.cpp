// cuDNN operation graphs and plans (cudnn_graph.h).
#include "kiln/backend/cuda/cudnn_graph.h"

#include <algorithm>

#include "kiln/backend/cuda/cudnn_device.h"
#include "kiln/core/error.h"

namespace kiln::cudnn {

BackendDescriptor::BackendDescriptor(DescriptorType type, std::string what) : what_(std::move(what)) {
  check(library().create_descriptor(type, &raw_), "creating a descriptor for " + what_);
}

BackendDescriptor::~BackendDescriptor() {
  if (raw_) library().destroy_descriptor(raw_);
}

BackendDescriptor::BackendDescriptor(BackendDescriptor&& other) noexcept
    : raw_(std::exchange(other.raw_, nullptr)), what_(std::move(other.what_)) {}

BackendDescriptor& BackendDescriptor::set(Attribute attribute, AttributeType type, int64_t count, const void* values) {
  check(library().set_attribute(raw_, attribute, type, count, values),
        what_ + " (attribute " + std::to_string(static_cast<int>(attribute)) + ")");
  return *this;
}

void BackendDescriptor::finalize() { check(library().finalize(raw_), "finalizing " + what_); }

OperationGraph::Id OperationGraph::add_tensor(const TensorLayout& layout, bool is_virtual, bool by_value) {
  KILN_CHECK(layout.dims.size() == 4 && layout.strides.size() == 4, "{}: a tensor needs 4 dims and 4 strides", what_);
  const Id id = kFirstId + static_cast<Id>(tensors_.size());
  BackendDescriptor descriptor(DescriptorType::Tensor, what_ + ", tensor " + std::to_string(id));
  const bool yes = true;
  descriptor.set_data_type(Attribute::TensorDataType, layout.type)
      .set_ints(Attribute::TensorDimensions, layout.dims)
      .set_ints(Attribute::TensorStrides, layout.strides)
      .set_int(Attribute::TensorUniqueId, id)
      .set_int(Attribute::TensorByteAlignment, 16);
  if (is_virtual) descriptor.set(Attribute::TensorIsVirtual, AttributeType::Boolean, 1, &yes);
  if (by_value) descriptor.set(Attribute::TensorIsByValue, AttributeType::Boolean, 1, &yes);
  descriptor.finalize();
  tensors_.push_back(std::move(descriptor));
  return id;
}

OperationGraph::Id OperationGraph::memory_tensor(const TensorLayout& layout) { return add_tensor(layout, false, false); }
OperationGraph::Id OperationGraph::virtual_tensor(const TensorLayout& layout) { return add_tensor(layout, true, false); }
OperationGraph::Id OperationGraph::scalar() {
  return add_tensor({{1, 1, 1, 1}, {1, 1, 1, 1}, DataType::Float}, false, true);
}

void OperationGraph::pointwise(PointwiseMode mode, std::initializer_list<Id> inputs, Id out, DataType compute,
                               int64_t axis) {
  KILN_CHECK(inputs.size() >= 1 && inputs.size() <= 3, "{}: a pointwise op takes 1 to 3 inputs", what_);
  const std::string name = what_ + ", pointwise op " + std::to_string(operations_.size());
  BackendDescriptor op_descriptor(DescriptorType::Pointwise, name);
  op_descriptor.set(Attribute::PointwiseMode, AttributeType::PointwiseMode, 1, &mode)
      .set_data_type(Attribute::PointwiseMathPrecision, compute);
  if (axis >= 0) op_descriptor.set_int(Attribute::PointwiseAxis, axis);
  op_descriptor.finalize();
  BackendDescriptor operation(DescriptorType::PointwiseOperation, name);
  operation.set_descriptor(Attribute::PointwiseOperationDescriptor, op_descriptor);
  const Attribute input_attributes[] = {Attribute::PointwiseOperationX, Attribute::PointwiseOperationB,
                                        Attribute::PointwiseOperationT};
  size_t index = 0;
  for (const Id input : inputs) operation.set_descriptor(input_attributes[index++], tensor(input));
  operation.set_descriptor(Attribute::PointwiseOperationY, tensor(out)).finalize();
  op_descriptors_.push_back(std::move(op_descriptor));
  operations_.push_back(std::move(operation));
}

void OperationGraph::reduction(ReductionOperator op, Id in, Id out) {
  const std::string name = what_ + ", reduction " + std::to_string(operations_.size());
  BackendDescriptor op_descriptor(DescriptorType::Reduction, name);
  op_descriptor.set(Attribute::ReductionOperator, AttributeType::ReductionOperator, 1, &op)
      .set_data_type(Attribute::ReductionComputeType, DataType::Float)
      .finalize();
  BackendDescriptor operation(DescriptorType::ReductionOperation, name);
  operation.set_descriptor(Attribute::ReductionOperationDescriptor, op_descriptor)
      .set_descriptor(Attribute::ReductionOperationX, tensor(in))
      .set_descriptor(Attribute::ReductionOperationY, tensor(out))
      .finalize();
  op_descriptors_.push_back(std::move(op_descriptor));
  operations_.push_back(std::move(operation));
}

void OperationGraph::matmul(Id a, Id b, Id c) {
  const std::string name = what_ + ", matmul " + std::to_string(operations_.size());
  BackendDescriptor op_descriptor(DescriptorType::Matmul, name);
  op_descriptor.set_data_type(Attribute::MatmulComputeType, DataType::Float).finalize();
  BackendDescriptor operation(DescriptorType::MatmulOperation, name);
  operation.set_descriptor(Attribute::MatmulOperationDescriptor, op_descriptor)
      .set_descriptor(Attribute::MatmulOperationA, tensor(a))
      .set_descriptor(Attribute::MatmulOperationB, tensor(b))
      .set_descriptor(Attribute::MatmulOperationC, tensor(c))
      .finalize();
  op_descriptors_.push_back(std::move(op_descriptor));
  operations_.push_back(std::move(operation));
}

void OperationGraph::reshape(Id in, Id out) {
  BackendDescriptor operation(DescriptorType::ReshapeOperation,
                              what_ + ", reshape " + std::to_string(operations_.size()));
  operation.set_descriptor(Attribute::ReshapeOperationX, tensor(in))
      .set_descriptor(Attribute::ReshapeOperationY, tensor(out))
      .finalize();
  operations_.push_back(std::move(operation));
}

namespace {

// The engine configurations cuDNN's heuristics (in `mode`) offer for `graph`, best first; none if
// the heuristics decline the graph.
std::vector<BackendDescriptor> engine_configs(const BackendDescriptor& graph, HeuristicsMode mode,
                                              const std::string& what) {
  BackendDescriptor heuristics(DescriptorType::EngineHeuristics, what + ", heuristics");
  heuristics.set_descriptor(Attribute::HeuristicsOperationGraph, graph)
      .set(Attribute::HeuristicsMode, AttributeType::HeuristicsMode, 1, &mode);
  if (library().finalize(heuristics.raw()) != 0) return {};
  int64_t count = 0;
  check(library().get_attribute(heuristics.raw(), Attribute::HeuristicsResults, AttributeType::Descriptor, 0, &count,
                                nullptr),
        what + ", counting the heuristics' results");
  std::vector<BackendDescriptor> configs;
  std::vector<Descriptor> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(DescriptorType::EngineConfig, what + ", engine configuration " + std::to_string(i));
    raw.push_back(configs.back().raw());
  }
  int64_t returned = 0;
  check(library().get_attribute(heuristics.raw(), Attribute::HeuristicsResults, AttributeType::Descriptor, count,
                                &returned, raw.data()),
        what + ", reading the heuristics' results");
  while (static_cast<int64_t>(configs.size()) > std::max<int64_t>(returned, 0)) configs.pop_back();
  return configs;
}
}  // namespace

BackendDescriptor OperationGraph::finalized(Handle handle) const {
  std::vector<Descriptor> operations;
  for (const BackendDescriptor& operation : operations_) operations.push_back(operation.raw());
  BackendDescriptor graph(DescriptorType::OperationGraph, what_);
  if (handle) graph.set(Attribute::OperationGraphHandle, AttributeType::Handle, 1, &handle);
  graph
      .set(Attribute::OperationGraphOperations, AttributeType::Descriptor, static_cast<int64_t>(operations.size()),
           operations.data())
      .finalize();
  return graph;
}

Plan OperationGraph::build(Handle handle) const {
  BackendDescriptor graph = finalized(handle);
  std::string reason = "the heuristics offered no engine";
  for (const HeuristicsMode mode : {HeuristicsMode::A, HeuristicsMode::Fallback}) {
    std::vector<BackendDescriptor> configs = engine_configs(graph, mode, what_);
    for (BackendDescriptor& config : configs) {
      BackendDescriptor plan(DescriptorType::ExecutionPlan, what_ + ", execution plan");
      plan.set(Attribute::PlanHandle, AttributeType::Handle, 1, &handle)
          .set_descriptor(Attribute::PlanEngineConfig, config);
      if (const Status status = library().finalize(plan.raw()); status != 0) {
        reason = library().get_error_string(status);
        reason += ' ' + last_error();
        continue;
      }
      int64_t workspace = 0, returned = 0;
      check(library().get_attribute(plan.raw(), Attribute::PlanWorkspaceSize, AttributeType::Int64, 1, &returned,
                                    &workspace),
            what_ + ", the plan's workspace size");
      return Plan(std::move(graph), std::move(config), std::move(plan), workspace, what_);
    }
  }
  if (describes_devices(library())) {  // each engine's own answer, knobs tried, for the error
    try {
      reason = describe_answers(engine_answers(*this, DeviceProperties::of(handle)));
    } catch (const Error& e) {
      reason += " (asking each engine failed too: " + std::string(e.what()) + ")";
    }
  }
  fail("cuDNN {} ({}) has no engine for {}: {}", library().version_text(), library().path, what_, reason);
}

void Plan::run(Handle handle, const std::vector<std::pair<OperationGraph::Id, void*>>& bindings,
               void* workspace) const {
  std::vector<int64_t> ids;
  std::vector<void*> pointers;
  for (const auto& [id, pointer] : bindings) {
    ids.push_back(id);
    pointers.push_back(pointer);
  }
  BackendDescriptor pack(DescriptorType::VariantPack, what_ + ", variant pack");
  pack.set_ints(Attribute::VariantPackUniqueIds, ids)
      .set(Attribute::VariantPackDataPointers, AttributeType::VoidPointer, static_cast<int64_t>(pointers.size()),
           pointers.data())
      .set(Attribute::VariantPackWorkspace, AttributeType::VoidPointer, 1, &workspace)
      .finalize();
  check(library().execute(handle, plan_.raw(), pack.raw()), "running " + what_);
}

}  // namespace kiln::cudnn
