// The tables of `kiln report`'s page, as HTML with every text escaped (svg_markup.h):
//   run_summary_table   the run at a glance: folder, event files, device, iterations, samples, the
//                       last training and validation losses, mean time per iteration, tokens/s and
//                       TFLOP/s per GPU, wall time
//   prediction_table    kiln estimate's prediction (run_report_prediction.h) beside what the run
//                       measured (run_report_measured.h): parameters, model FLOPs, memory per GPU,
//                       time per iteration, tokens/s, TFLOP/s per GPU, and measured / predicted.
//                       A cell that cannot be filled says why: the flag that measures it, or why
//                       the estimator predicts no time for the device
//   config_table        the resolved config (the `config` text, YAML of `key: value` lines), a row
//                       a key
// `prediction` is null for a run whose event files hold no estimate (kiln before it wrote one).
// Pure, thread-safe.
#pragma once

#include <string>

#include "kiln/obs/run_report_history.h"
#include "kiln/obs/run_report_measured.h"
#include "kiln/obs/run_report_prediction.h"

namespace kiln {

std::string run_summary_table(const RunHistory& history, const RunMeasured& measured, const RunPrediction* prediction);
std::string prediction_table(const RunMeasured& measured, const RunPrediction* prediction);
// `config_yaml` null: a line saying the event files hold no config.
std::string config_table(const std::string* config_yaml);

}  // namespace kiln
