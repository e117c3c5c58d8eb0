#include "kiln/data/preprocess.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/data/gpt2_tokenizer.h"
#include "kiln/data/indexed_dataset.h"
#include "kiln/data/prepare_text.h"

namespace kiln {

PreprocessSummary preprocess(const PreprocessOptions& options,
                             const std::function<void(const PreprocessSummary&)>& progress) {
  KILN_CHECK(!options.inputs.empty(), "preprocess: no --input files");
  KILN_CHECK(!options.output_prefix.empty(), "preprocess: no --output-prefix");
  KILN_CHECK(options.format == "jsonl" || options.format == "text", "preprocess: --input-format '{}' is not jsonl or text",
             options.format);
  KILN_CHECK(options.workers > 0, "preprocess: --workers must be positive, got {}", options.workers);
  const auto start = std::chrono::steady_clock::now();
  const Gpt2Tokenizer tokenizer(options.tokenizer_dir);
  // The prefix's folder is made, as prepare-text makes its output folder.
  const std::filesystem::path folder = std::filesystem::path(options.output_prefix).parent_path();
  std::error_code error;
  if (!folder.empty()) std::filesystem::create_directories(folder, error);
  KILN_CHECK(!error && (folder.empty() || std::filesystem::is_directory(folder)),
             "preprocess: cannot create the folder '{}' of --output-prefix: {}", folder.string(),
             error ? error.message() : "a file of that name is in the way");
  PreprocessSummary summary;
  summary.prefix = options.output_prefix + "_" + options.json_key + "_document";
  IndexedDatasetWriter writer(summary.prefix, best_fitting_dtype(tokenizer.vocab_size()));

  std::vector<std::string> batch;
  const auto flush = [&] {
    std::vector<std::vector<int32_t>> ids(batch.size());
    // Documents in parallel; each encode() then runs its merges on this thread alone.
#pragma omp parallel for schedule(dynamic) num_threads(options.workers)
    for (size_t d = 0; d < batch.size(); ++d) ids[d] = tokenizer.encode(batch[d]);
    for (auto& document : ids) {
      if (options.append_eod) document.push_back(Gpt2Tokenizer::kEndOfText);
      writer.add_document(document);
      summary.tokens += static_cast<int64_t>(document.size());
    }
    summary.documents += static_cast<int64_t>(batch.size());
    batch.clear();
    summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (progress) progress(summary);
  };

  for (const std::string& path : options.inputs) {
    std::ifstream stream(path, std::ios::binary);
    KILN_CHECK(stream.good(), "preprocess: cannot open input '{}'", path);
    if (options.format == "text") {
      std::ostringstream contents;
      contents << stream.rdbuf();
      batch.push_back(contents.str());
      const int64_t bad = find_invalid_utf8(batch.back());
      KILN_CHECK(bad < 0, "{}: not valid UTF-8 at byte offset {}", path, bad);
      summary.bytes += static_cast<int64_t>(batch.back().size());
    } else {
      std::string line;
      int64_t line_number = 0;
      while (std::getline(stream, line)) {
        ++line_number;
        if (line.empty()) continue;
        nlohmann::json record;
        try {
          record = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& error) {
          fail("{}:{}: not a JSON object: {}", path, line_number, error.what());
        }
        KILN_CHECK(record.is_object() && record.contains(options.json_key) && record[options.json_key].is_string(),
                   "{}:{}: no string field '{}'", path, line_number, options.json_key);
        batch.push_back(record[options.json_key].get<std::string>());
        summary.bytes += static_cast<int64_t>(batch.back().size());
        if (static_cast<int64_t>(batch.size()) >= options.batch_documents) flush();
      }
    }
    if (static_cast<int64_t>(batch.size()) >= options.batch_documents) flush();
  }
  if (!batch.empty()) flush();
  writer.finish();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace kiln
