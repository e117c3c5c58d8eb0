// What `kiln lab` measured (lab_runner.h): for each of the lab's experiments, its rows, each a
// setting of the base configuration and either its measurement or why it could not run here.
// The table for people, the JSON for machines (lab_result.cpp) and the HTML report
// (obs/lab_report.h) are all made from these values alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

struct LabMeasurement {
  double samples_per_second = 0;  // the global batch over the median step time
  double step_ms = 0;             // median wall time of the timed iterations
  int64_t peak_memory_bytes = 0;  // the most device memory kiln's buffers held at once (rank 0)
  double data_wait_share = 0;     // of the timed iterations' time, the share spent waiting for batches
  double ratio = 0;               // samples_per_second over the lab's baseline row's (1 for the baseline)
  double final_loss = 0;          // the last timed iteration's training loss (a sanity check)
};

struct LabRowResult {
  std::string name;  // "workers 4, pinned on"
  // The configuration keys the row sets on top of the base configuration, in order, as
  // `--print-config` would show them (key, value), and the number of data-parallel ranks.
  std::vector<std::pair<std::string, std::string>> settings;
  int ranks = 1;
  bool baseline = false;                     // the row the lab's ratios are relative to
  std::optional<LabMeasurement> measured;    // empty: the row did not run
  std::string unavailable;                   // why it did not run (empty when it ran)
};

struct LabExperiment {
  int number = 0;     // 1..6, the seed lab's numbering
  std::string title;  // "Data pre-loading"
  std::string question;  // what the lab asks, one sentence
  std::vector<LabRowResult> rows;
  std::string unavailable;  // the whole lab could not run here (its rows are then empty)
};

struct LabResults {
  std::string model;    // one line: the base's model as the run's log describes it, then its batch and data
  std::string machine;  // one line: "cpu (2 cores)", "cuda: NVIDIA H100 80GB HBM3"
  int64_t warmup_iters = 0, timed_iters = 0;
  std::vector<LabExperiment> labs;
};

// The table for people: one block per lab, a row per setting with samples/s, step time, peak
// memory, data-wait share and the ratio to the baseline, or the reason it did not run.
std::string lab_table(const LabResults& results);
// The same as one JSON document (nlohmann's dump, indent 2).
std::string lab_json(const LabResults& results);

}  // namespace kiln
