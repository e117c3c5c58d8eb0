// `kiln report RUN_DIR`: one self-contained HTML page of a training run (obs/run_report.h) from the
// TensorBoard event files in RUN_DIR, the --tensorboard-dir of `kiln train`; written to
// RUN_DIR/report.html or --output FILE, whose path it prints.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>

#include "kiln/cli/commands.h"
#include "kiln/obs/run_report.h"

namespace kiln::cli {

void add_report_command(CLI::App& root) {
  auto run_folder = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  CLI::App* command = root.add_subcommand(
      "report", "an HTML page of a run's curves, config and predicted-versus-measured, from its TensorBoard events");
  command->add_option("RUN_DIR", *run_folder, "the --tensorboard-dir of a kiln train run")->required();
  command->add_option("--output", *output, "the page to write (default: RUN_DIR/report.html)");
  command->callback([run_folder, output] {
    const std::string path = output->empty() ? (std::filesystem::path(*run_folder) / "report.html").string() : *output;
    write_run_report(*run_folder, path);
    fmt::print("{}\n", path);
  });
}

}  // namespace kiln::cli
