// cudnn_api.h's constants and entry point types against cuDNN's own header, where the build finds
// it (the CUDA toolkit's include folder often has it; kiln needs it neither to build nor to run).
// Nothing here runs: a mismatch fails the build.
#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>

#include <type_traits>

#include "kiln/backend/cuda/cudnn_api.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // the plan's and graph's handle attributes (9.19)

namespace kiln::cudnn {
namespace {

template <typename Ours, typename Theirs>
constexpr bool same_value(Ours ours, Theirs theirs) {
  return static_cast<long long>(ours) == static_cast<long long>(theirs);
}

static_assert(std::is_same_v<Handle, cudnnHandle_t>);
static_assert(std::is_same_v<Descriptor, cudnnBackendDescriptor_t>);
static_assert(sizeof(DescriptorType) == sizeof(cudnnBackendDescriptorType_t));
static_assert(sizeof(Attribute) == sizeof(cudnnBackendAttributeName_t));
static_assert(sizeof(AttributeType) == sizeof(cudnnBackendAttributeType_t));
static_assert(sizeof(DataType) == sizeof(cudnnDataType_t));
static_assert(sizeof(PointwiseMode) == sizeof(cudnnPointwiseMode_t));
static_assert(sizeof(ReductionOperator) == sizeof(cudnnReduceTensorOp_t));
static_assert(sizeof(HeuristicsMode) == sizeof(cudnnBackendHeurMode_t));
static_assert(sizeof(int) == sizeof(cudnnBackendKnobType_t));  // a knob type travels as an int
static_assert(sizeof(Status) == sizeof(cudnnStatus_t));
static_assert(sizeof(StatusCode) == sizeof(cudnnStatus_t));

#define KILN_SAME(ours, theirs) static_assert(same_value(ours, theirs), #ours " is not " #theirs)
KILN_SAME(DescriptorType::Pointwise, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
KILN_SAME(DescriptorType::Engine, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
KILN_SAME(DescriptorType::EngineConfig, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
KILN_SAME(DescriptorType::EngineHeuristics, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
KILN_SAME(DescriptorType::ExecutionPlan, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
KILN_SAME(DescriptorType::KnobChoice, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
KILN_SAME(DescriptorType::KnobInfo, CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR);
KILN_SAME(DescriptorType::PointwiseOperation, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
KILN_SAME(DescriptorType::OperationGraph, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
KILN_SAME(DescriptorType::VariantPack, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
KILN_SAME(DescriptorType::Tensor, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
KILN_SAME(DescriptorType::Matmul, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
KILN_SAME(DescriptorType::MatmulOperation, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
KILN_SAME(DescriptorType::Reduction, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
KILN_SAME(DescriptorType::ReductionOperation, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
KILN_SAME(DescriptorType::ReshapeOperation, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
KILN_SAME(DescriptorType::DeviceProperties, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);

KILN_SAME(AttributeType::Handle, CUDNN_TYPE_HANDLE);
KILN_SAME(AttributeType::DataType, CUDNN_TYPE_DATA_TYPE);
KILN_SAME(AttributeType::Boolean, CUDNN_TYPE_BOOLEAN);
KILN_SAME(AttributeType::Int64, CUDNN_TYPE_INT64);
KILN_SAME(AttributeType::VoidPointer, CUDNN_TYPE_VOID_PTR);
KILN_SAME(AttributeType::HeuristicsMode, CUDNN_TYPE_HEUR_MODE);
KILN_SAME(AttributeType::KnobType, CUDNN_TYPE_KNOB_TYPE);
KILN_SAME(AttributeType::PointwiseMode, CUDNN_TYPE_POINTWISE_MODE);
KILN_SAME(AttributeType::Descriptor, CUDNN_TYPE_BACKEND_DESCRIPTOR);
KILN_SAME(AttributeType::ReductionOperator, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE);
KILN_SAME(AttributeType::Char, CUDNN_TYPE_CHAR);

KILN_SAME(Attribute::PointwiseMode, CUDNN_ATTR_POINTWISE_MODE);
KILN_SAME(Attribute::PointwiseMathPrecision, CUDNN_ATTR_POINTWISE_MATH_PREC);
KILN_SAME(Attribute::PointwiseAxis, CUDNN_ATTR_POINTWISE_AXIS);
KILN_SAME(Attribute::HeuristicsMode, CUDNN_ATTR_ENGINEHEUR_MODE);
KILN_SAME(Attribute::HeuristicsOperationGraph, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
KILN_SAME(Attribute::HeuristicsResults, CUDNN_ATTR_ENGINEHEUR_RESULTS);
KILN_SAME(Attribute::EngineConfigEngine, CUDNN_ATTR_ENGINECFG_ENGINE);
KILN_SAME(Attribute::EngineConfigKnobChoices, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES);
KILN_SAME(Attribute::PlanHandle, CUDNN_ATTR_EXECUTION_PLAN_HANDLE);
KILN_SAME(Attribute::PlanEngineConfig, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
KILN_SAME(Attribute::PlanWorkspaceSize, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
KILN_SAME(Attribute::PlanDeviceProperties, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP);
KILN_SAME(Attribute::KnobChoiceType, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE);
KILN_SAME(Attribute::KnobChoiceValue, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE);
KILN_SAME(Attribute::KnobInfoType, CUDNN_ATTR_KNOB_INFO_TYPE);
KILN_SAME(Attribute::KnobInfoMaximum, CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE);
KILN_SAME(Attribute::KnobInfoMinimum, CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE);
KILN_SAME(Attribute::KnobInfoStride, CUDNN_ATTR_KNOB_INFO_STRIDE);
KILN_SAME(Attribute::PointwiseOperationDescriptor, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
KILN_SAME(Attribute::PointwiseOperationX, CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
KILN_SAME(Attribute::PointwiseOperationB, CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
KILN_SAME(Attribute::PointwiseOperationY, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
KILN_SAME(Attribute::PointwiseOperationT, CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
KILN_SAME(Attribute::OperationGraphHandle, CUDNN_ATTR_OPERATIONGRAPH_HANDLE);
KILN_SAME(Attribute::OperationGraphOperations, CUDNN_ATTR_OPERATIONGRAPH_OPS);
KILN_SAME(Attribute::OperationGraphEngineCount, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT);
KILN_SAME(Attribute::TensorByteAlignment, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
KILN_SAME(Attribute::TensorDataType, CUDNN_ATTR_TENSOR_DATA_TYPE);
KILN_SAME(Attribute::TensorDimensions, CUDNN_ATTR_TENSOR_DIMENSIONS);
KILN_SAME(Attribute::TensorStrides, CUDNN_ATTR_TENSOR_STRIDES);
KILN_SAME(Attribute::TensorUniqueId, CUDNN_ATTR_TENSOR_UNIQUE_ID);
KILN_SAME(Attribute::TensorIsVirtual, CUDNN_ATTR_TENSOR_IS_VIRTUAL);
KILN_SAME(Attribute::TensorIsByValue, CUDNN_ATTR_TENSOR_IS_BY_VALUE);
KILN_SAME(Attribute::VariantPackUniqueIds, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
KILN_SAME(Attribute::VariantPackDataPointers, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
KILN_SAME(Attribute::VariantPackWorkspace, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
KILN_SAME(Attribute::EngineOperationGraph, CUDNN_ATTR_ENGINE_OPERATION_GRAPH);
KILN_SAME(Attribute::EngineGlobalIndex, CUDNN_ATTR_ENGINE_GLOBAL_INDEX);
KILN_SAME(Attribute::EngineKnobInfo, CUDNN_ATTR_ENGINE_KNOB_INFO);
KILN_SAME(Attribute::EngineDeviceProperties, CUDNN_ATTR_ENGINE_DEVICEPROP);
KILN_SAME(Attribute::MatmulComputeType, CUDNN_ATTR_MATMUL_COMP_TYPE);
KILN_SAME(Attribute::MatmulOperationA, CUDNN_ATTR_OPERATION_MATMUL_ADESC);
KILN_SAME(Attribute::MatmulOperationB, CUDNN_ATTR_OPERATION_MATMUL_BDESC);
KILN_SAME(Attribute::MatmulOperationC, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
KILN_SAME(Attribute::MatmulOperationDescriptor, CUDNN_ATTR_OPERATION_MATMUL_DESC);
KILN_SAME(Attribute::ReductionOperator, CUDNN_ATTR_REDUCTION_OPERATOR);
KILN_SAME(Attribute::ReductionComputeType, CUDNN_ATTR_REDUCTION_COMP_TYPE);
KILN_SAME(Attribute::ReductionOperationX, CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
KILN_SAME(Attribute::ReductionOperationY, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
KILN_SAME(Attribute::ReductionOperationDescriptor, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
KILN_SAME(Attribute::ReshapeOperationX, CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
KILN_SAME(Attribute::ReshapeOperationY, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
KILN_SAME(Attribute::DevicePropertiesHandle, CUDNN_ATTR_DEVICEPROP_HANDLE);
KILN_SAME(Attribute::DevicePropertiesJson, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION);

KILN_SAME(DataType::Float, CUDNN_DATA_FLOAT);
KILN_SAME(DataType::Half, CUDNN_DATA_HALF);
KILN_SAME(DataType::Int32, CUDNN_DATA_INT32);
KILN_SAME(DataType::BFloat16, CUDNN_DATA_BFLOAT16);
KILN_SAME(DataType::Boolean, CUDNN_DATA_BOOLEAN);

KILN_SAME(PointwiseMode::Add, CUDNN_POINTWISE_ADD);
KILN_SAME(PointwiseMode::Mul, CUDNN_POINTWISE_MUL);
KILN_SAME(PointwiseMode::Div, CUDNN_POINTWISE_DIV);
KILN_SAME(PointwiseMode::Sub, CUDNN_POINTWISE_SUB);
KILN_SAME(PointwiseMode::Exp, CUDNN_POINTWISE_EXP);
KILN_SAME(PointwiseMode::Log, CUDNN_POINTWISE_LOG);
KILN_SAME(PointwiseMode::Identity, CUDNN_POINTWISE_IDENTITY);
KILN_SAME(PointwiseMode::CompareGreaterEqual, CUDNN_POINTWISE_CMP_GE);
KILN_SAME(PointwiseMode::GenerateIndex, CUDNN_POINTWISE_GEN_INDEX);
KILN_SAME(PointwiseMode::BinarySelect, CUDNN_POINTWISE_BINARY_SELECT);

KILN_SAME(ReductionOperator::Add, CUDNN_REDUCE_TENSOR_ADD);
KILN_SAME(ReductionOperator::Max, CUDNN_REDUCE_TENSOR_MAX);
KILN_SAME(HeuristicsMode::Fallback, CUDNN_HEUR_MODE_FALLBACK);
KILN_SAME(HeuristicsMode::A, CUDNN_HEUR_MODE_A);
KILN_SAME(StatusCode::Success, CUDNN_STATUS_SUCCESS);
KILN_SAME(StatusCode::NotSupportedRuntimePrerequisiteMissing, CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING);
#undef KILN_SAME

// The entry points' signatures, as cudnn_api.cpp casts them.
static_assert(std::is_same_v<decltype(&cudnnGetVersion), size_t (*)()>);
static_assert(std::is_same_v<decltype(&cudnnBackendExecute), cudnnStatus_t (*)(cudnnHandle_t, cudnnBackendDescriptor_t,
                                                                              cudnnBackendDescriptor_t)>);

}  // namespace
}  // namespace kiln::cudnn
#endif
