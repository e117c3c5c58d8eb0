// The `kiln` subcommands, one file each. Each add_*_command registers its subcommand, flags and
// callback on the root app; callbacks throw kiln::Error on bad input, which main() prints as one
// line and turns into exit status 1.
#pragma once

#include <CLI/CLI.hpp>

namespace kiln::cli {

void add_train_command(CLI::App& root);
void add_generate_command(CLI::App& root);
void add_classify_command(CLI::App& root);
void add_data_command(CLI::App& root);
void add_bench_command(CLI::App& root);
void add_bench_loader_command(CLI::App& bench);     // under `kiln bench`
void add_bench_attention_command(CLI::App& bench);  // under `kiln bench`
void add_bench_comm_command(CLI::App& bench);       // under `kiln bench`
void add_estimate_command(CLI::App& root);
void add_launch_command(CLI::App& root);
void add_report_command(CLI::App& root);
void add_top_command(CLI::App& root);
void add_lab_command(CLI::App& root);

}  // namespace kiln::cli
