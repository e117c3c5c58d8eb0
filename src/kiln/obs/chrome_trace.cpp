#include "kiln/obs/chrome_trace.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace kiln {
namespace {

double microseconds(int64_t ns) { return static_cast<double>(ns) / 1e3; }

nlohmann::json metadata(const char* name, int64_t pid, const nlohmann::json& args, int64_t tid = -1) {
  nlohmann::json event{{"name", name}, {"ph", "M"}, {"pid", pid}, {"args", args}};
  if (tid >= 0) event["tid"] = tid;
  return event;
}

}  // namespace

std::string chrome_trace_json(const std::vector<trace::Track>& tracks, const ChromeTraceProcess& process) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back(metadata("process_name", process.pid, {{"name", process.name}}));
  std::vector<const trace::Track*> ordered;
  for (const trace::Track& track : tracks) ordered.push_back(&track);
  std::stable_sort(ordered.begin(), ordered.end(), [](const trace::Track* a, const trace::Track* b) {
    return std::pair(a->device, a->id) < std::pair(b->device, b->id);
  });
  int64_t sort_index = 0;
  for (const trace::Track* track : ordered) {
    events.push_back(metadata("thread_name", process.pid, {{"name", track->name}}, track->id));
    events.push_back(metadata("thread_sort_index", process.pid, {{"sort_index", sort_index++}}, track->id));
    std::vector<const trace::Event*> sorted;
    for (const trace::Event& event : track->events) sorted.push_back(&event);
    std::stable_sort(sorted.begin(), sorted.end(), [](const trace::Event* a, const trace::Event* b) {
      return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->duration_ns > b->duration_ns;
    });
    for (const trace::Event* event : sorted) {
      const double ts = microseconds(event->start_ns - process.origin_ns);
      if (event->kind == trace::Event::Kind::Counter) {
        events.push_back({{"name", event->name}, {"ph", "C"}, {"ts", ts}, {"pid", process.pid},
                          {"args", {{"value", event->value}}}});
      } else {
        events.push_back({{"name", event->name}, {"cat", event->category}, {"ph", "X"}, {"ts", ts},
                          {"dur", microseconds(event->duration_ns)}, {"pid", process.pid}, {"tid", track->id}});
      }
    }
  }
  nlohmann::json trace{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  if (!process.other_data.empty()) trace["otherData"] = process.other_data;
  return trace.dump() + "\n";
}

}  // namespace kiln
