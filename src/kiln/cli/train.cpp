// `kiln train`: a YAML config (--config) overridden by Megatron-named flags, then training.
#include <fmt/format.h>

#include <memory>

#include "kiln/cli/commands.h"
#include "kiln/cli/config_flags.h"
#include "kiln/obs/log_line.h"
#include "kiln/train/trainer.h"

namespace kiln::cli {

void add_train_command(CLI::App& root) {
  auto flags = std::make_shared<ConfigFlags>();
  auto print_config = std::make_shared<bool>(false);
  CLI::App* command = root.add_subcommand("train", "train a GPT model");
  command->add_flag("--print-config", *print_config, "print the resolved config as YAML and exit");
  add_config_flags(*command, flags);
  command->callback([flags, print_config] {
    const Config config = flags->build();
    if (*print_config) {
      fmt::print("{}", to_yaml(resolve_config(config)));
      return;
    }
    Trainer trainer(config);
    LogLineObserver log(trainer.config().log_interval);
    trainer.add_observer(&log);
    trainer.run();
    if (const OpTimingBackend* timing = trainer.op_timing())
      fmt::print("time by op over the whole run (--profile-ops):\n{}", OpTimingBackend::format(timing->times()));
  });
}

}  // namespace kiln::cli
