// The seed lab's six experiments ("Methods and tools for efficient GPU training") as rows of
// settings over any base configuration, for `kiln lab`:
//   1 data pre-loading: loader workers 0/2/4/8 x pinned memory off/on, the prefetch depth, the
//     copy stream off, the sample cache
//   2 gradient tricks: recomputation (none, selective, full) x micro-batch and accumulation at the
//     same global batch
//   3 precision: fp32, TF32, fp16, bf16, fp8
//   4 storage: local file (memory-mapped, pread), S3, S3 through the local cache
//   5 all together: the fastest setting of each of labs 1-4 measured in the same run, combined
//   6 data-parallel ranks: 1, 2, 4 at the same global batch
// Each lab's first row is its baseline, which its ratios are relative to. A row that cannot run
// on this machine or with this configuration carries the reason instead (a CUDA switch on the CPU,
// S3 without --s3-data-path, more ranks than GPUs, a micro-batch the global batch does not split into); lab
// 5's rows are planned once labs 1-4 have been measured (plan_all_together).
// Pure functions.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "kiln/lab/lab_result.h"
#include "kiln/train/config.h"

namespace kiln {

struct LabMachine {
  bool cuda = false;        // the base configuration's device is cuda
  int gpus = 0;             // GPUs visible (cuda)
  int cores = 1;            // host cores
};

struct LabPlanOptions {
  std::set<int> labs = {1, 2, 3, 4, 5, 6};
  std::string s3_data_path;  // the base data on S3, for lab 4 (empty: its S3 rows do not run)
  std::string s3_cache_dir;  // the local cache folder lab 4's cached S3 row uses
};

// Labs 1-4 and 6 as asked, with their rows' settings and reasons; lab 5 as a placeholder without
// rows. `base` is the configuration the user gave, its data already local or mock.
std::vector<LabExperiment> plan_labs(const Config& base, const LabMachine& machine, const LabPlanOptions& options);

// Lab 5's rows: the base configuration (baseline) and the fastest measured row of each of `labs`'
// labs 1-4 combined, later labs' keys winning; or the reason nothing can be combined.
LabExperiment plan_all_together(const std::vector<LabExperiment>& labs);

// `base` with a row's settings applied, by key as the YAML file would set them (errors name the key).
Config with_settings(Config base, const LabRowResult& row);

}  // namespace kiln
