// The configuration flags shared by `kiln train` and `kiln bench train`: --config FILE plus one
// flag per Config field (config_fields()), booleans with a --no- negation, and a field's Megatron
// spelling where it differs (--DDP-impl). Values are kept as text in command-line order and
// applied over the YAML file by build().
//
// Unknown flags: the command collects every word it cannot place, and once it is parsed (before
// its callback runs) names each one on its own line with the closest known flag, a value given to
// an unknown flag (`--foo 3`, `--foo=3`) counted as that flag's. The lines are thrown as a
// CLI::ExtrasError, which main() prints like every other command-line error (exit code 109).
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

  // `defaults` (Config's own, or a command's: `kiln lab`'s classifier), then the YAML file, then
  // the flags.
  Config build(Config defaults = {}) const;
};

// Adds the flags to `command` and makes it refuse unknown ones as above. Call after the command's
// own options are added or before: the known flags are read when the command has been parsed.
void add_config_flags(CLI::App& command, const std::shared_ptr<ConfigFlags>& flags);

// One error line per unknown flag or stray word among `leftovers` (the words CLI11 could not
// place, in command-line order), each suggesting the flag of `known_flags` closest by edit
// distance when one is close; then a line saying `<command> --help` lists the known flags. Empty
// when there are no leftovers. Exposed for tests.
std::string unknown_flags_message(const std::vector<std::string>& leftovers,
                                  const std::vector<std::string>& known_flags, const std::string& command);

}  // namespace kiln::cli
