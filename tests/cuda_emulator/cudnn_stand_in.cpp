// cuDNN's backend API for the CPU emulator of CUDA: the entry points kiln's loader resolves
// (src/kiln/backend/cuda/cudnn_api.h), defined here and found in the test programs themselves
// (they export their symbols; CMakeLists.txt). Descriptors keep their attributes; a plan's
// execution interprets its operation graph op by op on the CPU, on the emulator's stream, with
// every tensor addressed through its own dims and strides:
//   - memory tensors at the variant pack's pointers (the emulator's device memory is host memory),
//     read and written in their dtype (bf16/fp16 rounded to nearest even);
//   - virtual tensors in fp32 buffers laid out by their strides, values rounded to their dtype;
//   - by-value scalars read when the plan is executed (as cuDNN takes them).
// Semantics, as cuDNN's graph API documents its ops: pointwise ops broadcast inputs of extent 1;
// GEN_INDEX gives the output's index along its axis; BINARY_SELECT is t ? x : b; CMP_GE is x >= b;
// a reduction folds the axes where its output's extent is 1; a matmul is batched over the leading
// two axes ([.., M, K] x [.., K, N]); a reshape gives its output the input's storage, element for
// element at the same offsets. What it cannot check: whether NVIDIA's engines accept a graph; it
// accepts every graph of these ops, with one engine configuration and no workspace.
#include <cuda_runtime.h>  // the emulator's

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "cuda_emulator.h"
#include "kiln/backend/cuda/cudnn_api.h"
#include "kiln/core/dtype.h"

namespace {

using kiln::cudnn::Attribute;
using kiln::cudnn::AttributeType;
using kiln::cudnn::DataType;
using kiln::cudnn::DescriptorType;
using kiln::cudnn::PointwiseMode;
using kiln::cudnn::ReductionOperator;

constexpr int kSuccess = 0, kBadParam = 2000, kNotSupported = 3000;

struct Descriptor {
  DescriptorType type;
  std::map<Attribute, std::vector<char>> attributes;  // raw elements as set
  const Descriptor* graph = nullptr;                  // an engine configuration's operation graph

  template <typename T>
  std::vector<T> get(Attribute attribute) const {
    const auto found = attributes.find(attribute);
    if (found == attributes.end()) return {};
    std::vector<T> values(found->second.size() / sizeof(T));
    std::memcpy(values.data(), found->second.data(), found->second.size());
    return values;
  }
  template <typename T>
  T one(Attribute attribute, T otherwise = T{}) const {
    const auto found = attributes.find(attribute);
    if (found == attributes.end() || found->second.size() < sizeof(T)) return otherwise;
    T value;
    std::memcpy(&value, found->second.data(), sizeof(T));
    return value;
  }
  const Descriptor* descriptor(Attribute attribute) const { return one<const Descriptor*>(attribute, nullptr); }
};

struct Handle {
  cudaStream_t stream = nullptr;
};

// A tensor while a graph runs: where its elements are and how they are laid out.
struct Values {
  std::array<int64_t, 4> dims{}, strides{};
  DataType type = DataType::Float;
  char* memory = nullptr;                     // memory tensors
  std::shared_ptr<std::vector<float>> local;  // virtual tensors and by-value scalars

  int64_t offset(const std::array<int64_t, 4>& index) const {
    int64_t at = 0;
    for (int d = 0; d < 4; ++d) at += (dims[d] == 1 ? 0 : index[d]) * strides[d];  // extent 1 broadcasts
    return at;
  }
  static float rounded(float value, DataType type) {
    switch (type) {
      case DataType::BFloat16: return kiln::bf16_to_float(kiln::float_to_bf16(value));
      case DataType::Half: return kiln::fp16_to_float(kiln::float_to_fp16(value));
      default: return value;
    }
  }
  float read(const std::array<int64_t, 4>& index) const {
    const int64_t at = offset(index);
    if (!memory) return (*local)[static_cast<size_t>(at)];
    switch (type) {
      case DataType::BFloat16: return kiln::bf16_to_float(reinterpret_cast<const uint16_t*>(memory)[at]);
      case DataType::Half: return kiln::fp16_to_float(reinterpret_cast<const uint16_t*>(memory)[at]);
      case DataType::Int32: return static_cast<float>(reinterpret_cast<const int32_t*>(memory)[at]);
      default: return reinterpret_cast<const float*>(memory)[at];
    }
  }
  void write(const std::array<int64_t, 4>& index, float value) const {
    const int64_t at = offset(index);
    if (!memory) {
      (*local)[static_cast<size_t>(at)] = rounded(value, type);
      return;
    }
    switch (type) {
      case DataType::BFloat16: reinterpret_cast<uint16_t*>(memory)[at] = kiln::float_to_bf16(value); return;
      case DataType::Half: reinterpret_cast<uint16_t*>(memory)[at] = kiln::float_to_fp16(value); return;
      case DataType::Int32: reinterpret_cast<int32_t*>(memory)[at] = static_cast<int32_t>(value); return;
      default: reinterpret_cast<float*>(memory)[at] = value;
    }
  }
};

template <typename Visit>
void for_each_index(const std::array<int64_t, 4>& dims, Visit visit) {
  std::array<int64_t, 4> i{};
  for (i[0] = 0; i[0] < dims[0]; ++i[0])
    for (i[1] = 0; i[1] < dims[1]; ++i[1])
      for (i[2] = 0; i[2] < dims[2]; ++i[2])
        for (i[3] = 0; i[3] < dims[3]; ++i[3]) visit(i);
}

float pointwise(PointwiseMode mode, float x, float b, float t, int64_t index_on_axis) {
  switch (mode) {
    case PointwiseMode::Add: return x + b;
    case PointwiseMode::Mul: return x * b;
    case PointwiseMode::Div: return x / b;
    case PointwiseMode::Sub: return x - b;
    case PointwiseMode::Exp: return std::exp(x);
    case PointwiseMode::Log: return std::log(x);
    case PointwiseMode::Identity: return x;
    case PointwiseMode::CompareGreaterEqual: return x >= b ? 1.0f : 0.0f;
    case PointwiseMode::GenerateIndex: return static_cast<float>(index_on_axis);
    case PointwiseMode::BinarySelect: return t != 0.0f ? x : b;
  }
  return NAN;
}

// One execution: every tensor of the graph, then its ops in order.
class Run {
 public:
  Run(const Descriptor& graph, const std::map<int64_t, void*>& pointers) {
    for (const Descriptor* op : graph.get<const Descriptor*>(Attribute::OperationGraphOperations)) {
      ops_.push_back(op);
      for (const Attribute a :
           {Attribute::PointwiseOperationX, Attribute::PointwiseOperationB, Attribute::PointwiseOperationT,
            Attribute::PointwiseOperationY, Attribute::ReductionOperationX, Attribute::ReductionOperationY,
            Attribute::MatmulOperationA, Attribute::MatmulOperationB, Attribute::MatmulOperationC,
            Attribute::ReshapeOperationX, Attribute::ReshapeOperationY})
        if (const Descriptor* tensor = op->descriptor(a)) add(*tensor, pointers);
    }
    alias_reshaped_memory();
  }
  void operator()() const {
    for (const Descriptor* op : ops_) run(*op);
  }

 private:
  void add(const Descriptor& tensor, const std::map<int64_t, void*>& pointers) {
    const int64_t id = tensor.one<int64_t>(Attribute::TensorUniqueId);
    if (values_.count(id)) return;
    Values v;
    const std::vector<int64_t> dims = tensor.get<int64_t>(Attribute::TensorDimensions),
                               strides = tensor.get<int64_t>(Attribute::TensorStrides);
    std::copy_n(dims.begin(), 4, v.dims.begin());
    std::copy_n(strides.begin(), 4, v.strides.begin());
    v.type = tensor.one<DataType>(Attribute::TensorDataType);
    int64_t span = 1;
    for (int d = 0; d < 4; ++d) span += (v.dims[d] - 1) * v.strides[d];
    if (tensor.one<bool>(Attribute::TensorIsByValue)) {  // read now: the caller's value may not outlive the call
      v.local = std::make_shared<std::vector<float>>(1, *static_cast<const float*>(pointers.at(id)));
      v.dims = {1, 1, 1, 1};
    } else if (tensor.one<bool>(Attribute::TensorIsVirtual)) {
      v.local = std::make_shared<std::vector<float>>(static_cast<size_t>(span), 0.0f);
    } else {
      v.memory = static_cast<char*>(pointers.at(id));
    }
    values_[id] = v;
  }
  const Values& of(const Descriptor* tensor) const {
    return values_.at(tensor->one<int64_t>(Attribute::TensorUniqueId));
  }

  void run(const Descriptor& op) const {
    switch (op.type) {
      case DescriptorType::PointwiseOperation: {
        const Descriptor& mode_of = *op.descriptor(Attribute::PointwiseOperationDescriptor);
        const auto mode = mode_of.one<PointwiseMode>(Attribute::PointwiseMode);
        const int64_t axis = mode_of.one<int64_t>(Attribute::PointwiseAxis, 0);
        const Values& y = of(op.descriptor(Attribute::PointwiseOperationY));
        const Values& x = of(op.descriptor(Attribute::PointwiseOperationX));
        const Descriptor* b = op.descriptor(Attribute::PointwiseOperationB);
        const Descriptor* t = op.descriptor(Attribute::PointwiseOperationT);
        for_each_index(y.dims, [&](const std::array<int64_t, 4>& i) {
          y.write(i, pointwise(mode, x.read(i), b ? of(b).read(i) : 0.0f, t ? of(t).read(i) : 0.0f,
                               i[static_cast<size_t>(axis)]));
        });
        return;
      }
      case DescriptorType::ReductionOperation: {
        const auto op_type =
            op.descriptor(Attribute::ReductionOperationDescriptor)->one<ReductionOperator>(Attribute::ReductionOperator);
        const Values& x = of(op.descriptor(Attribute::ReductionOperationX));
        const Values& y = of(op.descriptor(Attribute::ReductionOperationY));
        std::map<int64_t, double> folded;  // by y's offset
        for_each_index(x.dims, [&](const std::array<int64_t, 4>& i) {
          const float value = x.read(i);
          const auto [slot, fresh] = folded.try_emplace(y.offset(i), op_type == ReductionOperator::Max ? -INFINITY : 0.0);
          slot->second = op_type == ReductionOperator::Max ? std::max<double>(slot->second, value) : slot->second + value;
        });
        for_each_index(y.dims, [&](const std::array<int64_t, 4>& i) {
          y.write(i, static_cast<float>(folded.at(y.offset(i))));
        });
        return;
      }
      case DescriptorType::MatmulOperation: {
        const Values& a = of(op.descriptor(Attribute::MatmulOperationA));
        const Values& b = of(op.descriptor(Attribute::MatmulOperationB));
        const Values& c = of(op.descriptor(Attribute::MatmulOperationC));
        const int64_t K = a.dims[3];
        for_each_index(c.dims, [&](const std::array<int64_t, 4>& i) {
          double sum = 0.0;
          for (int64_t k = 0; k < K; ++k)
            sum += static_cast<double>(a.read({i[0], i[1], i[2], k})) * b.read({i[0], i[1], k, i[3]});
          c.write(i, static_cast<float>(sum));
        });
        return;
      }
      case DescriptorType::ReshapeOperation: {
        const Values& x = of(op.descriptor(Attribute::ReshapeOperationX));
        const Values& y = of(op.descriptor(Attribute::ReshapeOperationY));
        if (!x.local || !y.local) return;  // a reshape of a memory tensor into a virtual one: see below
        for (size_t at = 0; at < std::min(x.local->size(), y.local->size()); ++at)
          (*y.local)[at] = Values::rounded((*x.local)[at], y.type);
        return;
      }
      default: return;
    }
  }

  // A virtual tensor reshaped from a memory tensor reads the memory itself (its elements are the
  // memory's, at the same offsets).
  void alias_reshaped_memory() {
    for (const Descriptor* op : ops_) {
      if (op->type != DescriptorType::ReshapeOperation) continue;
      const Values& x = of(op->descriptor(Attribute::ReshapeOperationX));
      Values& y = values_.at(op->descriptor(Attribute::ReshapeOperationY)->one<int64_t>(Attribute::TensorUniqueId));
      if (x.memory && y.local) {
        y.memory = x.memory;
        y.local.reset();
      }
    }
  }

  std::vector<const Descriptor*> ops_;
  std::map<int64_t, Values> values_;
};

}  // namespace

extern "C" {

size_t cudnnGetVersion() { return 90600; }  // as the dQ sums' zeroing is the library's from 9.6 on
const char* cudnnGetErrorString(int status) {
  return status == kSuccess ? "CUDNN_STATUS_SUCCESS (stand-in)" : "CUDNN_STATUS_NOT_SUPPORTED (stand-in)";
}
void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (max_size) message[0] = '\0';
}
int cudnnCreate(Handle** handle) {
  *handle = new Handle;
  return kSuccess;
}
int cudnnDestroy(Handle* handle) {
  delete handle;
  return kSuccess;
}
int cudnnSetStream(Handle* handle, cudaStream_t stream) {
  handle->stream = stream;
  return kSuccess;
}
int cudnnBackendCreateDescriptor(DescriptorType type, Descriptor** descriptor) {
  *descriptor = new Descriptor{type, {}, nullptr};
  return kSuccess;
}
int cudnnBackendDestroyDescriptor(Descriptor* descriptor) {
  delete descriptor;
  return kSuccess;
}
int cudnnBackendFinalize(Descriptor* descriptor) { return descriptor ? kSuccess : kBadParam; }
int cudnnBackendSetAttribute(Descriptor* descriptor, Attribute attribute, AttributeType type, int64_t count,
                             const void* elements) {
  // Element sizes by attribute type: handles, descriptors and pointers are pointers, int64 8 bytes,
  // the enumerations 4, a boolean a C bool.
  size_t size = 8;
  switch (type) {
    case AttributeType::DataType:
    case AttributeType::HeuristicsMode:
    case AttributeType::PointwiseMode:
    case AttributeType::ReductionOperator: size = 4; break;
    case AttributeType::Boolean: size = sizeof(bool); break;
    default: break;
  }
  const auto* bytes = static_cast<const char*>(elements);
  descriptor->attributes[attribute].assign(bytes, bytes + size * static_cast<size_t>(count));
  return kSuccess;
}
int cudnnBackendGetAttribute(const Descriptor* descriptor, Attribute attribute, int, int64_t requested,
                             int64_t* count, void* elements) {
  if (attribute == Attribute::HeuristicsResults) {  // one engine configuration: the graph's
    *count = 1;
    if (requested >= 1) static_cast<Descriptor**>(elements)[0]->graph =
        descriptor->descriptor(Attribute::HeuristicsOperationGraph);
    return kSuccess;
  }
  if (attribute == Attribute::PlanWorkspaceSize) {
    *count = 1;
    *static_cast<int64_t*>(elements) = 0;
    return kSuccess;
  }
  return kNotSupported;
}
int cudnnBackendExecute(Handle* handle, const Descriptor* plan, const Descriptor* pack) {
  const Descriptor* config = plan->descriptor(Attribute::PlanEngineConfig);
  if (!config || !config->graph) return kBadParam;
  const std::vector<int64_t> ids = pack->get<int64_t>(Attribute::VariantPackUniqueIds);
  const std::vector<void*> pointers = pack->get<void*>(Attribute::VariantPackDataPointers);
  if (ids.size() != pointers.size()) return kBadParam;
  std::map<int64_t, void*> bound;
  for (size_t i = 0; i < ids.size(); ++i) bound[ids[i]] = pointers[i];
  try {
    auto run = std::make_shared<Run>(*config->graph, bound);
    cuda_emulator::submit(handle->stream, [run] { (*run)(); });
  } catch (const std::out_of_range&) {
    return kBadParam;  // a tensor the variant pack does not bind
  }
  return kSuccess;
}

}  // extern "C"
