// StepTraceObserver: the step trace of --profile (Megatron's --profile with --profile-step-start S
// and --profile-step-end E): records iterations S+1 .. E (Megatron starts its profiler before the
// step after iteration S and stops it after iteration E) and writes them as one Chrome trace
// (chrome_trace.h) when iteration E ends, or at finish() when the run ends sooner. A run resumed
// inside the window traces what is left of it.
//
// What a trace holds: the trainer thread's steps ("iteration N", category "step") and their parts
// (the next micro-batch, forward and backward of each micro-batch, the loss's device wait, the
// gradients' reduction, the optimizer, the device synchronisation), every back-end op inside them
// (TracingBackend: category "op"), the loader workers' reads ("data"), the Gloo communication
// thread's collectives ("communication"), on CUDA the kernels on the "compute stream" track, and
// the counter "memory allocated (bytes)". Nothing is recorded outside the window.
//
// The folder is created and tried for writing at construction, so a bad one fails before the
// first step; the file is written atomically. One StepTraceObserver per process.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/backend/op_tracing.h"
#include "kiln/obs/observer.h"

namespace kiln {

struct StepTraceOptions {
  int64_t step_start = 0, step_end = 0;  // iterations step_start+1 .. step_end
  std::string dir = {};        // created with its parents
  std::string file_name = {};  // "NAME.pt.trace.json"
  int64_t rank = 0;
  std::string process_name = {};  // "kiln rank 0"
};

// The file name of a rank's trace: "<profile_name>.pt.trace.json" (with "_rank<r>" before the
// suffix where `world_size` > 1), or PyTorch's tensorboard_trace_handler's "<host>_<pid>.<ms since
// the epoch>.pt.trace.json" when `profile_name` is empty, which TensorBoard's profile plugin finds.
std::string step_trace_file_name(const std::string& profile_name, int64_t rank, int64_t world_size);

class StepTraceObserver final : public TrainObserver {
 public:
  StepTraceObserver(StepTraceOptions options, TracingBackend& backend);
  ~StepTraceObserver() override;  // a recording still under way is dropped

  void on_iteration_begin(int64_t iteration) override;
  void on_iteration(const IterationStats& stats) override;
  // Writes a recording still under way (the run ended inside the window). Idempotent.
  void finish();
  // The file written, and the iterations it holds; empty until it is written.
  const std::string& written_path() const { return written_path_; }
  std::string written_iterations() const;

 private:
  void write();
  StepTraceOptions options_;
  TracingBackend& backend_;
  std::string path_;
  bool recording_ = false;
  int64_t first_traced_ = 0, last_traced_ = 0;
  int64_t origin_ns_ = 0;
  std::string written_path_;
};

}  // namespace kiln
