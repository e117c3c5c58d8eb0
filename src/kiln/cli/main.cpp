// kiln: train, sample from and prepare data for GPT models. See README.md for the commands.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "kiln/backend/registry.h"
#include "kiln/cli/commands.h"
#include "kiln/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln: efficient GPT training on CPUs and GPUs, every technique a measured switch"};
  app.require_subcommand(0, 1);
  bool show_version = false;
  app.add_flag("--version", show_version, "print the version and build options");
  kiln::cli::add_train_command(app);
  kiln::cli::add_generate_command(app);
  kiln::cli::add_classify_command(app);
  kiln::cli::add_data_command(app);
  kiln::cli::add_bench_command(app);
  kiln::cli::add_estimate_command(app);
  kiln::cli::add_launch_command(app);
  kiln::cli::add_report_command(app);
  kiln::cli::add_top_command(app);
  kiln::cli::add_lab_command(app);
  try {
    app.parse(argc, argv);
    if (show_version) {
#ifdef KILN_WITH_CUDA
      const char* cuda = "built with CUDA";
#else
      const char* cuda = "built without CUDA";
#endif
      fmt::print("kiln {} ({}; {} CUDA device(s) visible)\n", KILN_VERSION, cuda, kiln::cuda_device_count());
      return 0;
    }
    if (app.get_subcommands().empty()) {
      std::fputs(app.help().c_str(), stdout);
      return 1;
    }
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const kiln::Error& error) {
    fmt::print(stderr, "kiln: error: {}\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    fmt::print(stderr, "kiln: error: {}\n", error.what());
    return 1;
  }
  return 0;
}
