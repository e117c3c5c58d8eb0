#include "kiln/cli/config_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <optional>
#include <string_view>

namespace kiln::cli {
namespace {

// Levenshtein distance, ignoring case (Megatron spells --DDP-impl in capitals).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];  // row[i - 1][j - 1]
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                        std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({above + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string_view without_dashes(std::string_view flag) {
  return flag.substr(std::min(flag.find_first_not_of('-'), flag.size()));
}

// The known flag nearest `flag`, if the edits are few next to its length (a third of the name,
// dashes aside, so `-x` suggests nothing and `--hiden-size` suggests --hidden-size).
std::optional<std::string> closest_flag(std::string_view flag, const std::vector<std::string>& known_flags) {
  const std::string_view name = without_dashes(flag);
  std::optional<std::string> best;
  size_t best_distance = name.size() / 3 + 1;
  for (const std::string& known : known_flags) {
    const size_t distance = edit_distance(name, without_dashes(known));
    if (distance < best_distance) {
      best = known;
      best_distance = distance;
    }
  }
  return best;
}

bool is_number(const std::string& word) {
  char* end = nullptr;
  std::strtod(word.c_str(), &end);
  return !word.empty() && end == word.c_str() + word.size();
}

// What CLI11 would have read as an option: a dash first, and not a negative number.
bool looks_like_flag(const std::string& word) { return word.size() > 1 && word[0] == '-' && !is_number(word); }

std::vector<std::string> known_flags_of(const CLI::App& command) {
  std::vector<std::string> flags;
  for (const CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) flags.push_back("--" + name);
    for (const std::string& name : option->get_snames()) flags.push_back("-" + name);
  }
  return flags;
}

// "kiln train", "kiln bench train": the command as a user types it.
std::string command_path(const CLI::App& command) {
  std::string path;
  for (const CLI::App* app = &command; app->get_parent() != nullptr; app = app->get_parent())
    path = " " + app->get_name() + path;
  return "kiln" + path;
}

}  // namespace

Config ConfigFlags::build(Config defaults) const {
  if (!config_file.empty()) apply_yaml_file(defaults, config_file);
  for (const auto& [field, value] : overrides) set_config_field(defaults, *field, value, flag_name(*field));
  return defaults;
}

std::string unknown_flags_message(const std::vector<std::string>& leftovers,
                                  const std::vector<std::string>& known_flags, const std::string& command) {
  std::vector<std::string> lines;
  for (size_t i = 0; i < leftovers.size(); ++i) {
    const std::string& word = leftovers[i];
    if (word == "--") continue;  // CLI11's end of options: nothing of its own to report
    if (!looks_like_flag(word)) {
      lines.push_back(fmt::format("kiln: error: unexpected argument '{}' ({} takes flags only)", word, command));
      continue;
    }
    const std::string flag = word.substr(0, word.find('='));
    // The word after an unknown flag is its value unless it is a flag itself: CLI11 cannot know
    // whether the flag takes one, and `--foo 3` is one mistake, not two.
    if (flag.size() == word.size() && i + 1 < leftovers.size() && leftovers[i + 1] != "--" &&
        !looks_like_flag(leftovers[i + 1]))
      ++i;
    std::string line = fmt::format("kiln: error: unknown flag '{}'", flag);
    if (const auto suggestion = closest_flag(flag, known_flags)) line += fmt::format(" (did you mean {}?)", *suggestion);
    lines.push_back(std::move(line));
  }
  if (lines.empty()) return "";
  std::string message;
  for (const std::string& line : lines) message += line + "\n";
  return message + fmt::format("kiln: the flags `{} --help` lists are the ones it knows", command);
}

void add_config_flags(CLI::App& command, const std::shared_ptr<ConfigFlags>& flags) {
  command.add_option("--config", flags->config_file, "YAML file of config keys (flags override it)")
      ->check(CLI::ExistingFile);
  for (const ConfigField& field : config_fields()) {
    const ConfigField* pointer = &field;
    const std::string name = flag_name(field);
    const std::string alias = field.flag_alias ? std::string(field.flag_alias) : "";
    const auto spellings = [&](const std::string& prefix) {  // "--x" or "--x,--X", each with `prefix` after "--"
      const std::string first = "--" + prefix + name.substr(2);
      return alias.empty() ? first : first + ",--" + prefix + alias.substr(2);
    };
    // Each callback runs as its flag is read (trigger_on_parse), so the overrides keep command-line
    // order and the last of repeated flags wins (`--fp16 --no-fp16`, `--lr 1 --lr 2`), as with
    // Megatron's argparse, where scripts append overrides to a base command line.
    if (std::holds_alternative<bool Config::*>(field.member) && !field.flag_takes_value) {
      command
          .add_flag_function(
              spellings(""), [flags, pointer](int64_t) { flags->overrides.emplace_back(pointer, "true"); }, field.help)
          ->trigger_on_parse();
      command
          .add_flag_function(
              spellings("no-"), [flags, pointer](int64_t) { flags->overrides.emplace_back(pointer, "false"); },
              "turn off " + name)
          ->trigger_on_parse();
    } else {
      command
          .add_option_function<std::string>(
              spellings(""),
              [flags, pointer](const std::string& value) { flags->overrides.emplace_back(pointer, value); },
              field.help)
          ->trigger_on_parse();
    }
  }
  // Unknown words are collected rather than refused one line for all, and named once the command
  // is parsed, before its callback (set by the command's owner) runs.
  command.allow_extras();
  CLI::App* self = &command;
  command.parse_complete_callback([self] {
    const std::string message = unknown_flags_message(self->remaining(), known_flags_of(*self), command_path(*self));
    if (!message.empty()) throw CLI::ExtrasError(message, CLI::ExitCodes::ExtrasError);
  });
}

}  // namespace kiln::cli
