// `kiln data preprocess` (Megatron's tools/preprocess_data.py, in C++): JSON lines (the `text`
// field, or json_key) or plain-text files (one document each) -> GPT-2 BPE ids -> a Megatron
// indexed dataset OUTPUT_PREFIX_<key>_document.{bin,idx}. uint16 tokens when the vocabulary fits,
// int32 otherwise; append_eod adds <|endoftext|> after each document. Documents are tokenized in
// parallel (workers threads) and written in input order, so the output does not depend on the
// worker count. Bad input names the file and line.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kiln {

struct PreprocessOptions {
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::string format = "jsonl";  // jsonl or text
  std::string json_key = "text";
  std::string tokenizer_dir;
  bool append_eod = false;
  int workers = 1;
  int64_t batch_documents = 1024;  // documents tokenized per parallel batch
};

struct PreprocessSummary {
  std::string prefix;  // OUTPUT_PREFIX_<key>_document
  int64_t documents = 0, tokens = 0, bytes = 0;
  double seconds = 0;
};

// `progress` (may be empty) is called after each batch with the running summary.
PreprocessSummary preprocess(const PreprocessOptions& options,
                             const std::function<void(const PreprocessSummary&)>& progress = {});

}  // namespace kiln
