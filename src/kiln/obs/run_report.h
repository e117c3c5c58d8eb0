// `kiln report`: one self-contained HTML page about a training run, made from its TensorBoard event
// files alone (run_report_history.h), so it works for any past run whose files remain:
//   - the run at a glance (run_report_tables.h)
//   - its curves as inline SVG charts: loss with validation over it, learning rate, gradient norm,
//     throughput, time per iteration, memory (run_report_charts.h)
//   - kiln estimate's prediction beside what was measured (run_report_prediction.h,
//     run_report_measured.h)
//   - the resolved config
// The page has no script and loads nothing: styles are inline, the charts are <svg> elements, and
// a Content-Security-Policy forbids any fetch, so it opens the same offline, from an e-mail or an
// archive. Every text from the files is escaped.
//
// write_run_report() replaces `output` atomically (core/atomic_file.h). Errors are kiln::Errors
// naming the path: the folder or an event file that cannot be read (run_report_history.h), an
// estimate text that is not kiln's JSON, an output that cannot be written. Pure functions apart
// from the files; thread-safe.
#pragma once

#include <string>

#include "kiln/obs/run_report_history.h"

namespace kiln {

std::string render_run_report(const RunHistory& history);
void write_run_report(const std::string& run_folder, const std::string& output);

}  // namespace kiln
