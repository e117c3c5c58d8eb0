// One frame of `kiln top`: readings in, text out, nothing read or written, so a frame can be
// checked with readings given by hand. For a width of 90:
//
//   kiln top  12:00:00  every 1 s, q quits
//
//   GPU 0  NVIDIA H100 80GB HBM3  power 312 W  temp 54 C  SM 1980 MHz  memory 2619 MHz
//     util [||||||||||             ]  45%  mem [||||||||||||           ] 40.0 GiB / 80.0 GiB
//     pid    4242  kiln               38.2 GiB
//
//   run 127.0.0.1:9400  rank 0  host node1
//     iteration 1000 / 3000 [|||||||||||||||                             ]  33.3%  ETA 8m 20s
//     loss 3.1416  lr 3.00e-04  tokens/s 12.3k  step 250.00 ms  data wait 2.0%
//
// - Without GPUs the GPU section is "no GPU: <why>"; without --metrics the run section says how to
//   follow a run. A reading that is absent shows as "n/a", or is left out where only some runs
//   have it (validation loss, MFU, skipped iterations).
// - A run's page that was not read shows "run HOST:PORT" and the reason on the next lines.
// - ETA is the iterations left x the pace's seconds per iteration (top_run.h).
// - Every line ends in '\n' and is at most `width` columns: lists of readings and reasons wrap,
//   anything longer is cut. Control characters from outside (names, labels, reasons) show as '?',
//   so a page cannot move the cursor.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/obs/top_gpus.h"
#include "kiln/obs/top_run.h"

namespace kiln {

constexpr int kMinTopWidth = 40;  // a narrower width renders as this one

struct TopRun {
  std::string endpoint;  // MetricsEndpoint::name()
  std::string error;     // why the page was not read (metrics_scrape.h); empty when it was
  RunReading reading;
  RunPace pace;
};

struct TopFrame {
  std::string title;  // the first line
  TopGpus gpus;
  std::vector<TopRun> runs;
};

std::string render_top_frame(const TopFrame& frame, int width);

// The first `rows` lines of `text` (at least one); when there are more, the last line shown says
// how many were left out, so a frame taller than the terminal does not scroll it.
std::string fit_to_height(std::string_view text, int rows);

}  // namespace kiln
