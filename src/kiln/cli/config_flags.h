// The configuration flags shared by `kiln train` and `kiln bench train`: --config FILE plus one
// flag per Config field (config_fields()), booleans with a --no- negation. Values are kept as
// text in command-line order and applied over the YAML file by build().
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/train/config.h"

namespace kiln::cli {

struct ConfigFlags {
  std::string config_file;
  std::vector<std::pair<const ConfigField*, std::string>> overrides;

  Config build() const;  // defaults, then the YAML file, then the flags
};

void add_config_flags(CLI::App& command, const std::shared_ptr<ConfigFlags>& flags);

}  // namespace kiln::cli
