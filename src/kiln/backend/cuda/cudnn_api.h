// The part of cuDNN 9's C API kiln uses (the backend "graph" API: descriptors set attribute by
// attribute, finalized, and executed), declared here and loaded at run time with dlopen, so that
// kiln builds and runs without cuDNN installed: only `--cudnn-attention` needs it (cudnn_attention.h).
//
// The constants are cuDNN 9's values (cudnn_graph_v9.h; the backend API is stable across 9.x, and
// cudnn_api_check.cpp compares each with the header where the header is found). The library is
// libcudnn.so.9, or the file KILN_CUDNN_LIBRARY names; it loads its engine libraries
// (libcudnn_graph.so.9, libcudnn_engines_*.so.9) itself, from the loader's search path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

struct cudnnContext;  // cuDNN's handle type, as cudnn_graph.h names it

namespace kiln::cudnn {

using Handle = ::cudnnContext*;
using Descriptor = void*;
using Status = int;  // cudnnStatus_t; 0 is success

// The cudnnStatus_t values kiln tells apart.
enum class StatusCode : int { Success = 0, NotSupportedRuntimePrerequisiteMissing = 3008 };

// cudnnBackendDescriptorType_t
enum class DescriptorType : int {
  Pointwise = 0,
  Engine = 2,
  EngineConfig = 3,
  EngineHeuristics = 4,
  ExecutionPlan = 5,
  KnobChoice = 7,
  KnobInfo = 8,
  PointwiseOperation = 13,
  OperationGraph = 15,
  VariantPack = 16,
  Tensor = 17,
  Matmul = 18,
  MatmulOperation = 19,
  Reduction = 21,
  ReductionOperation = 22,
  ReshapeOperation = 31,
  DeviceProperties = 38,  // cuDNN 9.8 on
};

// cudnnBackendAttributeType_t
enum class AttributeType : int {
  Handle = 0,
  DataType = 1,
  Boolean = 2,
  Int64 = 3,
  VoidPointer = 6,
  HeuristicsMode = 8,
  KnobType = 9,
  PointwiseMode = 14,
  Descriptor = 15,
  ReductionOperator = 18,
  Char = 24,
};

// cudnnBackendAttributeName_t
enum class Attribute : int {
  PointwiseMode = 0,
  PointwiseMathPrecision = 1,
  PointwiseAxis = 9,
  HeuristicsMode = 200,
  HeuristicsOperationGraph = 201,
  HeuristicsResults = 202,
  EngineConfigEngine = 300,
  EngineConfigKnobChoices = 302,
  PlanHandle = 400,
  PlanEngineConfig = 401,
  PlanWorkspaceSize = 402,
  PlanDeviceProperties = 407,
  KnobChoiceType = 600,
  KnobChoiceValue = 601,
  PointwiseOperationDescriptor = 750,
  PointwiseOperationX = 751,
  PointwiseOperationB = 752,
  PointwiseOperationY = 753,
  PointwiseOperationT = 758,
  OperationGraphHandle = 800,
  OperationGraphOperations = 801,
  OperationGraphEngineCount = 802,
  TensorByteAlignment = 900,
  TensorDataType = 901,
  TensorDimensions = 902,
  TensorStrides = 903,
  TensorUniqueId = 906,
  TensorIsVirtual = 907,
  TensorIsByValue = 908,
  VariantPackUniqueIds = 1000,
  VariantPackDataPointers = 1001,
  VariantPackWorkspace = 1003,
  KnobInfoType = 1200,
  KnobInfoMaximum = 1201,
  KnobInfoMinimum = 1202,
  KnobInfoStride = 1203,
  EngineOperationGraph = 1300,
  EngineGlobalIndex = 1301,
  EngineKnobInfo = 1302,
  EngineDeviceProperties = 1307,
  MatmulComputeType = 1500,
  MatmulOperationA = 1520,
  MatmulOperationB = 1521,
  MatmulOperationC = 1522,
  MatmulOperationDescriptor = 1523,
  ReductionOperator = 1600,
  ReductionComputeType = 1601,
  ReductionOperationX = 1610,
  ReductionOperationY = 1611,
  ReductionOperationDescriptor = 1612,
  ReshapeOperationX = 2200,
  ReshapeOperationY = 2201,
  DevicePropertiesHandle = 2701,
  DevicePropertiesJson = 2702,
};

// cudnnDataType_t
enum class DataType : int { Float = 0, Half = 2, Int32 = 4, BFloat16 = 9, Boolean = 11 };

// cudnnPointwiseMode_t
enum class PointwiseMode : int {
  Add = 0,
  Mul = 1,
  Div = 6,
  Sub = 9,
  Exp = 13,
  Log = 15,
  Identity = 21,
  CompareGreaterEqual = 303,
  GenerateIndex = 501,
  BinarySelect = 601,
};

// cudnnReduceTensorOp_t
enum class ReductionOperator : int { Add = 0, Max = 3 };

// cudnnBackendHeurMode_t
enum class HeuristicsMode : int { Fallback = 2, A = 3 };

// The entry points, resolved from the loaded library.
struct Library {
  size_t (*get_version)();
  const char* (*get_error_string)(Status);
  void (*get_last_error_string)(char*, size_t);
  Status (*create)(Handle*);
  Status (*destroy)(Handle);
  Status (*set_stream)(Handle, void* stream);
  Status (*create_descriptor)(DescriptorType, Descriptor*);
  Status (*destroy_descriptor)(Descriptor);
  Status (*finalize)(Descriptor);
  Status (*set_attribute)(Descriptor, Attribute, AttributeType, int64_t count, const void* elements);
  Status (*get_attribute)(Descriptor, Attribute, AttributeType, int64_t requested, int64_t* count, void* elements);
  Status (*execute)(Handle, Descriptor plan, Descriptor variant_pack);
  std::string path;  // the file loaded (what dlopen was given if the loader does not say)
  size_t version = 0;  // cudnnGetVersion(): major * 10000 + minor * 100 + patch
  size_t cudart_version = 0;  // cudnnGetCudartVersion(), the CUDA runtime it was built for; 0 if absent
  std::string version_text() const;  // "9.19.0"
};

// The library, loaded on the first call; a kiln::Error naming the file and dlopen's reason if it
// cannot be loaded or lacks an entry point, or if it is older than cuDNN 9 (each later call repeats
// the error).
const Library& library();

// What library() does once: opens `path` (empty: this program's own symbols) and resolves the entry
// points, with the same errors; a library refused is closed again. A library from a file also loads
// the NVRTC its runtime-compiled engines use, if present, and keeps it loaded (cudnn_api.cpp says
// why).
Library open_library(const std::string& path);

// The NVRTC cuDNN loads for its runtime-compiled engines: "libnvrtc.so.13" for a cuDNN built for
// the CUDA 13 runtime (cudnnGetCudartVersion() 13000).
std::string nvrtc_library_name(size_t cudart_version);

// cuDNN's message for the last call that failed on this thread; empty if it gave none.
std::string last_error();

// A failed call becomes a kiln::Error: "cuDNN error in <what>: <status text> (<cuDNN's last error
// message>)".
void check(Status status, const std::string& what);

}  // namespace kiln::cudnn
