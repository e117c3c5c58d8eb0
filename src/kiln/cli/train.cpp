// `kiln train`: a YAML config (--config) overridden by Megatron-named flags, then training.
#include <fmt/format.h>

#include <map>
#include <memory>

#include "kiln/cli/commands.h"
#include "kiln/obs/log_line.h"
#include "kiln/train/trainer.h"

namespace kiln::cli {
namespace {

struct TrainOptions {
  std::string config_file;
  bool print_config = false;
  std::vector<std::pair<const ConfigField*, std::string>> overrides;  // in command-line order
};

}  // namespace

void add_train_command(CLI::App& root) {
  auto options = std::make_shared<TrainOptions>();
  CLI::App* command = root.add_subcommand("train", "train a GPT model");
  command->add_option("--config", options->config_file, "YAML file of config keys (flags override it)")
      ->check(CLI::ExistingFile);
  command->add_flag("--print-config", options->print_config, "print the resolved config as YAML and exit");
  for (const ConfigField& field : config_fields()) {
    const ConfigField* pointer = &field;
    if (std::holds_alternative<bool Config::*>(field.member)) {
      command->add_flag_function(
          flag_name(field), [options, pointer](int64_t) { options->overrides.emplace_back(pointer, "true"); },
          field.help);
    } else {
      command->add_option_function<std::string>(
          flag_name(field),
          [options, pointer](const std::string& value) { options->overrides.emplace_back(pointer, value); },
          field.help);
    }
  }
  command->callback([options] {
    Config config;
    if (!options->config_file.empty()) apply_yaml_file(config, options->config_file);
    for (const auto& [field, value] : options->overrides)
      set_config_field(config, *field, value, flag_name(*field));
    if (options->print_config) {
      fmt::print("{}", to_yaml(resolve_config(config)));
      return;
    }
    Trainer trainer(config);
    LogLineObserver log(trainer.config().log_interval);
    trainer.add_observer(&log);
    trainer.run();
  });
}

}  // namespace kiln::cli
