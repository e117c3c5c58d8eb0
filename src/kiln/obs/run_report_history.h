// A run's history as its TensorBoard event files hold it: every `events.out.tfevents.*` file of
// the folder (`kiln train --tensorboard-dir`), read with tensorboard_reader.h and merged.
//
// A resumed run adds a file whose steps continue the earlier ones; where two events hold the same
// tag at the same step (a run resumed from an older checkpoint repeats steps), the one with the
// later wall time wins, as the run went on from it. Of a text tag the latest text by wall time is
// kept (a resumed run writes its config again).
//
// Errors are kiln::Errors naming the path: a folder that is missing or is not one, a folder without
// event files, and any file the reader refuses. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

struct ScalarPoint {
  int64_t step = 0;
  double value = 0;
};

struct RunHistory {
  std::string folder;
  std::vector<std::string> files;                           // the event files, sorted by name
  std::map<std::string, std::vector<ScalarPoint>> scalars;  // by tag, steps ascending, each once
  std::map<std::string, std::string> texts;                 // by tag, the latest
  // The sum over the files of the time from each file's first event to its last: the run's wall
  // time, without the pauses between a stop and its resumption.
  double wall_seconds = 0;

  // The points of `tag`; empty when the run has none.
  const std::vector<ScalarPoint>& scalar(std::string_view tag) const;
  // The text of `tag`, or nullptr.
  const std::string* text(std::string_view tag) const;
};

RunHistory read_run_history(const std::string& folder);

}  // namespace kiln
