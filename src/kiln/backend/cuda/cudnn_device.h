// A GPU as cuDNN describes it, and how cuDNN's engines answer an operation graph for it, with or
// without that GPU present.
//
// cuDNN 9.8 added device descriptions (CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR) so that plans can be
// made where the GPU is absent ("Deviceless ahead-of-time compilation", cudnn-frontend docs). kiln
// uses them twice: its tests ask the cuDNN on a machine without a GPU whether its engines take
// kiln's attention graphs for an H100 (tests/backend/cudnn_graph_check_test.cpp), and a graph no
// engine takes on this GPU is reported with each engine's reason (OperationGraph::build).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/backend/cuda/cudnn_graph.h"

namespace kiln::cudnn {

// A GPU described to cuDNN: from a handle's device, or from the JSON cuDNN writes for one (json()).
// A kiln::Error naming `source` and cuDNN's reason if cuDNN refuses the JSON, and one saying so
// where the loaded cuDNN predates 9.8.
class DeviceProperties {
 public:
  static DeviceProperties of(Handle handle);
  static DeviceProperties from_json(const std::string& json, const std::string& source);
  std::string json() const;
  const BackendDescriptor& descriptor() const { return descriptor_; }

 private:
  explicit DeviceProperties(BackendDescriptor descriptor) : descriptor_(std::move(descriptor)) {}
  BackendDescriptor descriptor_;
};

bool describes_devices(const Library& library);  // cuDNN 9.8 or later

// One engine's answer for a graph on a described GPU: the best status of finalizing a plan of
// engine `engine` (cuDNN's global index) with every knob at its default or with one knob set to
// each of its values in turn (knobs past the first 256 values untried), and cuDNN's reason.
struct EngineAnswer {
  int64_t engine;
  Status status;
  std::string reason;  // cuDNN's, where it gave one
};

// Finalized, or refused only for a missing runtime prerequisite: the engines that compile their
// kernels at run time (NVRTC) need the CUDA driver, which a machine without a GPU lacks. Either way
// the engine has taken the graph.
bool passes_graph_checks(Status status);

std::vector<EngineAnswer> engine_answers(const OperationGraph& graph, const DeviceProperties& device);

// "engine 0: CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN (reason); engine 1: ..." for error messages.
std::string describe_answers(const std::vector<EngineAnswer>& answers);

}  // namespace kiln::cudnn
