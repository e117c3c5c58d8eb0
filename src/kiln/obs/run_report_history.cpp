#include "kiln/obs/run_report_history.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "kiln/core/error.h"
#include "kiln/obs/tensorboard_reader.h"

namespace kiln {
namespace {

// The event files of `folder`, sorted by name; an Error naming the folder when it has none.
std::vector<std::string> event_files_in(const std::string& folder) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(folder, error);
  KILN_CHECK(std::filesystem::exists(status), "cannot report on '{}': there is no such folder", folder);
  KILN_CHECK(std::filesystem::is_directory(status),
             "cannot report on '{}': it is a file, not a folder (give the --tensorboard-dir of a kiln train run)",
             folder);
  std::vector<std::string> files;
  for (std::filesystem::directory_iterator entry(folder, error), end; !error && entry != end; entry.increment(error))
    if (entry->path().filename().string().starts_with("events.out.tfevents.")) files.push_back(entry->path().string());
  KILN_CHECK(!error, "cannot list the folder '{}': {}", folder, error.message());
  KILN_CHECK(!files.empty(),
             "no TensorBoard event files (events.out.tfevents.*) in '{}': give the --tensorboard-dir of a kiln "
             "train run",
             folder);
  std::sort(files.begin(), files.end());
  return files;
}

struct Stamped {
  double wall_time = 0;
  double value = 0;
};

}  // namespace

const std::vector<ScalarPoint>& RunHistory::scalar(std::string_view tag) const {
  static const std::vector<ScalarPoint> kNone;
  const auto found = scalars.find(std::string(tag));
  return found == scalars.end() ? kNone : found->second;
}

const std::string* RunHistory::text(std::string_view tag) const {
  const auto found = texts.find(std::string(tag));
  return found == texts.end() ? nullptr : &found->second;
}

RunHistory read_run_history(const std::string& folder) {
  RunHistory history;
  history.folder = folder;
  history.files = event_files_in(folder);
  std::map<std::string, std::map<int64_t, Stamped>> scalars;
  std::map<std::string, std::pair<double, std::string>> texts;  // tag -> (wall time, text)
  for (const std::string& file : history.files) {
    const std::vector<Event> events = read_event_file(file);
    if (!events.empty()) history.wall_seconds += events.back().wall_time - events.front().wall_time;
    for (const Event& event : events) {
      for (const EventValue& value : event.values) {
        if (value.simple_value) {
          const auto [at, added] =
              scalars[value.tag].try_emplace(event.step, Stamped{event.wall_time, *value.simple_value});
          if (!added && event.wall_time >= at->second.wall_time) at->second = {event.wall_time, *value.simple_value};
        }
        if (value.text) {
          const auto [at, added] = texts.try_emplace(value.tag, event.wall_time, *value.text);
          if (!added && event.wall_time >= at->second.first) at->second = {event.wall_time, *value.text};
        }
      }
    }
  }
  for (const auto& [tag, steps] : scalars) {
    std::vector<ScalarPoint>& points = history.scalars[tag];
    for (const auto& [step, stamped] : steps) points.push_back({step, stamped.value});
  }
  for (auto& [tag, stamped] : texts) history.texts[tag] = std::move(stamped.second);
  return history;
}

}  // namespace kiln
