#include "kiln/cli/config_flags.h"

namespace kiln::cli {

Config ConfigFlags::build() const {
  Config config;
  if (!config_file.empty()) apply_yaml_file(config, config_file);
  for (const auto& [field, value] : overrides) set_config_field(config, *field, value, flag_name(*field));
  return config;
}

void add_config_flags(CLI::App& command, const std::shared_ptr<ConfigFlags>& flags) {
  command.add_option("--config", flags->config_file, "YAML file of config keys (flags override it)")
      ->check(CLI::ExistingFile);
  for (const ConfigField& field : config_fields()) {
    const ConfigField* pointer = &field;
    const std::string name = flag_name(field);
    if (std::holds_alternative<bool Config::*>(field.member)) {
      command.add_flag_function(
          name, [flags, pointer](int64_t) { flags->overrides.emplace_back(pointer, "true"); }, field.help);
      command.add_flag_function(
          "--no-" + name.substr(2), [flags, pointer](int64_t) { flags->overrides.emplace_back(pointer, "false"); },
          "turn off " + name);
    } else {
      command.add_option_function<std::string>(
          name, [flags, pointer](const std::string& value) { flags->overrides.emplace_back(pointer, value); },
          field.help);
    }
  }
}

}  // namespace kiln::cli
