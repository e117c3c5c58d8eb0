// cuDNN's descriptions of GPUs and its engines' answers for them (cudnn_device.h).
#include "kiln/backend/cuda/cudnn_device.h"

#include <algorithm>
#include <optional>

#include "kiln/core/error.h"

namespace kiln::cudnn {
namespace {

constexpr size_t kFirstVersionDescribingDevices = 90800;

void require_device_descriptions(const std::string& what) {
  if (!describes_devices(library()))
    fail("{}: cuDNN {} ({}) cannot describe a GPU; that needs cuDNN 9.8 or later", what, library().version_text(),
         library().path);
}

// One of an engine's knobs: its type (cudnnBackendKnobType_t) and the values it takes.
struct Knob {
  int type;
  int64_t minimum, maximum, stride;
};

int64_t knob_value(Descriptor info, Attribute attribute, const std::string& what) {
  int64_t value = 0, returned = 0;
  check(library().get_attribute(info, attribute, AttributeType::Int64, 1, &returned, &value), what);
  return value;
}

std::vector<Knob> knobs_of(const BackendDescriptor& engine) {
  constexpr int64_t kMostKnobs = 64;  // cuDNN 9.19 has 44 knob types
  std::vector<BackendDescriptor> infos;
  std::vector<Descriptor> raw;
  for (int64_t i = 0; i < kMostKnobs; ++i) {
    infos.emplace_back(DescriptorType::KnobInfo, engine.what() + ", knob " + std::to_string(i));
    raw.push_back(infos.back().raw());
  }
  int64_t count = 0;
  check(library().get_attribute(engine.raw(), Attribute::EngineKnobInfo, AttributeType::Descriptor, kMostKnobs, &count,
                                raw.data()),
        engine.what() + ", its knobs");
  std::vector<Knob> knobs;
  for (size_t i = 0; i < static_cast<size_t>(std::clamp<int64_t>(count, 0, kMostKnobs)); ++i) {
    const std::string what = infos[i].what();
    Knob knob{};
    int64_t returned = 0;
    check(library().get_attribute(raw[i], Attribute::KnobInfoType, AttributeType::KnobType, 1, &returned, &knob.type),
          what + ", its type");
    knob.minimum = knob_value(raw[i], Attribute::KnobInfoMinimum, what + ", its least value");
    knob.maximum = knob_value(raw[i], Attribute::KnobInfoMaximum, what + ", its greatest value");
    knob.stride = std::max<int64_t>(knob_value(raw[i], Attribute::KnobInfoStride, what + ", its stride"), 1);
    knobs.push_back(knob);
  }
  return knobs;
}

// The status of finalizing a plan of `engine` with `knob` set to `value` (no knob: every knob at its
// default) for the GPU `device` describes.
Status plan_status(const BackendDescriptor& engine, const Knob* knob, int64_t value, const DeviceProperties& device) {
  BackendDescriptor config(DescriptorType::EngineConfig, engine.what() + ", a configuration");
  config.set_descriptor(Attribute::EngineConfigEngine, engine);
  std::optional<BackendDescriptor> choice;
  if (knob) {
    choice.emplace(DescriptorType::KnobChoice, engine.what() + ", a knob choice");
    choice->set(Attribute::KnobChoiceType, AttributeType::KnobType, 1, &knob->type)
        .set_int(Attribute::KnobChoiceValue, value)
        .finalize();
    config.set_descriptor(Attribute::EngineConfigKnobChoices, *choice);
  }
  if (const Status status = library().finalize(config.raw()); status != 0) return status;
  BackendDescriptor plan(DescriptorType::ExecutionPlan, engine.what() + ", a plan");
  plan.set_descriptor(Attribute::PlanEngineConfig, config)
      .set_descriptor(Attribute::PlanDeviceProperties, device.descriptor());
  return library().finalize(plan.raw());
}

// Engine `index`'s answer (cudnn_device.h).
EngineAnswer answer_of(const BackendDescriptor& graph, int64_t index, const DeviceProperties& device) {
  constexpr int64_t kMostValuesTried = 256;  // per knob
  BackendDescriptor engine(DescriptorType::Engine, graph.what() + ", engine " + std::to_string(index));
  engine.set_descriptor(Attribute::EngineOperationGraph, graph)
      .set_int(Attribute::EngineGlobalIndex, index)
      .set_descriptor(Attribute::EngineDeviceProperties, device.descriptor());
  Status status = library().finalize(engine.raw());
  if (status != 0) return {index, status, last_error()};
  status = plan_status(engine, nullptr, 0, device);
  for (const Knob& knob : knobs_of(engine)) {
    for (int64_t value = knob.minimum, tried = 0;
         !passes_graph_checks(status) && value <= knob.maximum && tried < kMostValuesTried;
         value += knob.stride, ++tried)
      status = plan_status(engine, &knob, value, device);
  }
  return {index, status, passes_graph_checks(status) ? std::string() : last_error()};
}

}  // namespace

bool describes_devices(const Library& library) { return library.version >= kFirstVersionDescribingDevices; }

DeviceProperties DeviceProperties::of(Handle handle) {
  require_device_descriptions("describing this GPU to cuDNN");
  BackendDescriptor descriptor(DescriptorType::DeviceProperties, "this GPU's cuDNN description");
  descriptor.set(Attribute::DevicePropertiesHandle, AttributeType::Handle, 1, &handle).finalize();
  return DeviceProperties(std::move(descriptor));
}

DeviceProperties DeviceProperties::from_json(const std::string& json, const std::string& source) {
  const std::string what = "the GPU description in " + source;
  require_device_descriptions(what);
  BackendDescriptor descriptor(DescriptorType::DeviceProperties, what);
  descriptor.set(Attribute::DevicePropertiesJson, AttributeType::Char, static_cast<int64_t>(json.size()), json.data());
  if (const Status status = library().finalize(descriptor.raw()); status != 0)
    fail("cuDNN refuses {}: {} {}", what, library().get_error_string(status), last_error());
  return DeviceProperties(std::move(descriptor));
}

std::string DeviceProperties::json() const {
  int64_t size = 0;
  check(library().get_attribute(descriptor_.raw(), Attribute::DevicePropertiesJson, AttributeType::Char, 0, &size,
                                nullptr),
        descriptor_.what() + ", its JSON's size");
  std::string json(static_cast<size_t>(std::max<int64_t>(size, 0)), '\0');
  int64_t returned = 0;
  check(library().get_attribute(descriptor_.raw(), Attribute::DevicePropertiesJson, AttributeType::Char, size,
                                &returned, json.data()),
        descriptor_.what() + ", its JSON");
  json.resize(static_cast<size_t>(std::clamp<int64_t>(returned, 0, size)));
  while (!json.empty() && json.back() == '\0') json.pop_back();
  return json;
}

bool passes_graph_checks(Status status) {
  return status == static_cast<Status>(StatusCode::Success) ||
         status == static_cast<Status>(StatusCode::NotSupportedRuntimePrerequisiteMissing);
}

std::vector<EngineAnswer> engine_answers(const OperationGraph& graph, const DeviceProperties& device) {
  const BackendDescriptor finalized = graph.finalized(nullptr);
  int64_t count = 0, returned = 0;
  check(library().get_attribute(finalized.raw(), Attribute::OperationGraphEngineCount, AttributeType::Int64, 1,
                                &returned, &count),
        finalized.what() + ", counting cuDNN's engines");
  std::vector<EngineAnswer> answers;
  for (int64_t index = 0; index < count; ++index) answers.push_back(answer_of(finalized, index, device));
  return answers;
}

std::string describe_answers(const std::vector<EngineAnswer>& answers) {
  std::string text;
  for (const EngineAnswer& answer : answers) {
    if (!text.empty()) text += "; ";
    text += "engine " + std::to_string(answer.engine) + ": " + library().get_error_string(answer.status);
    if (!answer.reason.empty()) text += " (" + answer.reason + ")";
  }
  return text.empty() ? "cuDNN has no engines for it" : text;
}

}  // namespace kiln::cudnn
