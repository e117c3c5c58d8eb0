// `kiln lab --report`: one self-contained HTML page of what the seed lab measured (lab/lab_result.h),
// made from the LabResults alone:
//   - the base model, the machine, and the warm-up and timed iterations every row ran
//   - per lab: its number, title and question; a horizontal bar chart of samples/s, a bar a row that
//     ran, the baseline's bar in a colour of its own (svg_bar_chart.h); and a table of every row:
//     its settings (key=value, and the ranks where more than one), samples/s, step time (ms), peak
//     memory (MiB), data-wait share (%) and the ratio to the baseline, or why it did not run
//   - a lab that could not run at all: why, and nothing else
// Like `kiln report`'s page (run_report.h), it has no script and loads nothing: styles are inline,
// the charts are <svg> elements, and a Content-Security-Policy forbids any fetch. Every text from
// the results is escaped (svg_markup.h).
//
// write_lab_report() replaces `output` atomically (core/atomic_file.h); a failed write is a
// kiln::Error naming the path. Pure functions apart from the file; thread-safe.
#pragma once

#include <string>

#include "kiln/lab/lab_result.h"

namespace kiln {

std::string render_lab_report(const LabResults& results);
void write_lab_report(const LabResults& results, const std::string& output);

}  // namespace kiln
