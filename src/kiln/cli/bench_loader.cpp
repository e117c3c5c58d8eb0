// `kiln bench loader`: what each loading knob buys. Sweeps storage (local memory map, local pread,
// S3, S3 behind the cache directory) x cache (decoded samples) x workers x prefetch, reading the
// same batches twice (pass 1 cold, pass 2 warm: the page cache, the LRU sample cache and the S3
// chunk cache all show their effect there), and prints samples/s and MB/s per pass. Batches land
// in BatchStager slots of the chosen device, so on CUDA `--pin-memory 0,1` also sweeps pinned vs
// pageable staging with the copy to the GPU included. With `--model-iters N` it then trains a
// small GPT for N steps per setting and reports the share of step time spent waiting for data.
// A sequence-classification folder (metadata.json, `kiln data synth`) is measured by decoding
// every row once per pass with the workers splitting the rows, as torch's DataLoader does with the
// same worker count (bench/peers/pytorch_loader.py). Raw text for a classifier (a .csv or .jsonl
// file or folder, data/text_classification.h) goes through the loader like token data, each
// sample tokenized by the loader's workers (data/classification_tokens.h).
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "kiln/backend/registry.h"
#include "kiln/cli/commands.h"
#include "kiln/core/error.h"
#include "kiln/data/classification_csv.h"
#include "kiln/data/classification_tokens.h"
#include "kiln/data/gpt_dataset.h"
#include "kiln/data/loader.h"
#include "kiln/data/token_dataset.h"
#include "kiln/train/trainer.h"

namespace kiln::cli {
namespace {

struct BenchLoaderOptions {
  std::string data_path, s3_path, cache_dir, split = "969,30,1", device = "cpu";
  int64_t vocab_size = 0, seq_length = 1024, micro_batch_size = 8, batches = 200;
  std::vector<std::string> storage = {"mmap"};
  std::vector<int> workers = {0, 1, 2, 4}, prefetch = {2}, pin_memory = {1};
  std::vector<int64_t> cache = {0};
  int64_t model_iters = 0, model_layers = 2, model_hidden = 128, model_heads = 4;
  // Raw-text classification data (a .csv or .jsonl file or folder).
  std::string tokenizer_dir, text_key = "text", label_key = "label";
  int64_t num_labels = 2;
  bool json = false;
};

struct StorageChoice {
  std::string name, path;
  StorageOptions options;
};

StorageChoice storage_choice(const BenchLoaderOptions& o, const std::string& name) {
  StorageChoice choice{name, o.data_path, {}};
  if (name == "mmap" || name == "pread") {
    choice.options.local_io = parse_local_io(name);
    KILN_CHECK(!is_s3_uri(o.data_path), "--storage {} reads local files, but --data-path is '{}'", name, o.data_path);
    return choice;
  }
  KILN_CHECK(name == "s3" || name == "s3-cache", "--storage '{}' is not mmap, pread, s3 or s3-cache", name);
  KILN_CHECK(!o.s3_path.empty(), "--storage {} needs --s3-path (the same data on S3)", name);
  choice.path = o.s3_path;
  if (name == "s3-cache") {
    KILN_CHECK(!o.cache_dir.empty(), "--storage s3-cache needs --cache-dir");
    choice.options.cache_dir = o.cache_dir;
  }
  return choice;
}

// A .csv or .jsonl file, or a folder of them without the synthetic CSV's metadata.json: raw text
// for a classifier (text_classification.h).
bool is_text_classification(const std::string& path) {
  const auto text_file = [](const std::filesystem::path& file) {
    return file.extension() == ".csv" || file.extension() == ".jsonl";
  };
  if (!std::filesystem::is_directory(path)) return text_file(path);
  if (std::filesystem::exists(std::filesystem::path(path) / "metadata.json")) return false;
  for (const auto& entry : std::filesystem::directory_iterator(path))
    if (text_file(entry.path())) return true;
  return false;
}

std::unique_ptr<TokenSource> open_source(const BenchLoaderOptions& o, const StorageChoice& choice,
                                         const Storage& storage) {
  if (is_text_classification(o.data_path)) {
    KILN_CHECK(o.model_iters == 0, "--model-iters trains a GPT, which does not read classification data");
    static const Gpt2Tokenizer tokenizer(o.tokenizer_dir);  // one command, one tokenizer
    return open_text_classification_tokens(choice.path, tokenizer, {o.text_key, o.label_key, o.seq_length, o.num_labels},
                                           1234, storage);
  }
  if (is_indexed_data_path(choice.path, storage)) {
    KILN_CHECK(o.vocab_size > 0, "--vocab-size is required for indexed data");
    return make_gpt_data(choice.path, o.split, DataSplit::Train, o.vocab_size, o.seq_length,
                         o.batches * o.micro_batch_size, 1234, storage);
  }
  const auto vocab =
      o.vocab_size > 0 ? std::optional<int64_t>(o.vocab_size) : read_data_vocab_size(choice.path, storage);
  KILN_CHECK(vocab.has_value(), "--vocab-size is required ({}/meta.json not found)", choice.path);
  return std::make_unique<TokenDataset>(choice.path, "train", *vocab, o.seq_length, 1234, storage);
}

// Share of training step time spent waiting for batches, over `iters` steps of a small GPT.
double data_wait_share(const BenchLoaderOptions& o, const StorageChoice& choice, int workers, int prefetch,
                       int64_t cache, bool pinned) {
  Config config;
  config.device = o.device;
  config.data_path = choice.path;
  config.data_io = choice.options.local_io == LocalIo::Pread ? "pread" : "mmap";
  config.cache_dir = choice.options.cache_dir;
  config.vocab_size = o.vocab_size;
  config.split = o.split;
  config.num_layers = o.model_layers;
  config.hidden_size = o.model_hidden;
  config.num_attention_heads = o.model_heads;
  config.seq_length = o.seq_length;
  config.micro_batch_size = o.micro_batch_size;
  config.train_iters = o.model_iters;
  config.disable_validation();
  config.num_workers = workers;
  config.prefetch_factor = prefetch;
  config.data_cache_samples = cache;
  config.pin_memory = pinned;
  Trainer trainer(config);
  double waited = 0, total = 0;
  for (int64_t i = 0; i < o.model_iters; ++i) {
    const IterationStats stats = trainer.train_step();
    if (i == 0) continue;  // the first step fills the pipeline
    waited += stats.data_wait_ms;
    total += stats.elapsed_ms;
  }
  return total > 0 ? waited / total : 0.0;
}

// Rows decoded per second by `workers` threads (0: the calling thread) over the whole set, each
// thread taking batches of micro_batch_size rows in turn.
double csv_rows_per_second(const ClassificationDataset& data, int workers, int64_t batch) {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> checksum{0};  // keeps the decoding from being optimised away
  const auto work = [&] {
    int64_t sum = 0;
    for (int64_t first; (first = next.fetch_add(batch)) < data.size();)
      for (int64_t row = first; row < std::min(first + batch, data.size()); ++row) {
        const ClassificationSample sample = data.sample(row);
        sum += sample.label + sample.input_ids.front();
      }
    checksum += sum;
  };
  const auto start = std::chrono::steady_clock::now();
  if (workers == 0) {
    work();
  } else {
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) threads.emplace_back(work);
    for (std::thread& thread : threads) thread.join();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(data.size()) / seconds;
}

void bench_csv(const BenchLoaderOptions& o) {
  const ClassificationDataset data(o.data_path);
  if (!o.json)
    fmt::print("# kiln bench loader | {} | classification CSV, {} rows of {} tokens | every row decoded per pass\n"
               "#{:>8} {:>16} {:>16}\n",
               o.data_path, data.size(), data.seq_length(), "workers", "pass 1 rows/s", "pass 2 rows/s");
  for (int workers : o.workers) {
    const double first = csv_rows_per_second(data, workers, o.micro_batch_size);
    const double second = csv_rows_per_second(data, workers, o.micro_batch_size);
    if (o.json) {
      fmt::print("{}\n", nlohmann::json{{"data_path", o.data_path}, {"format", "csv"}, {"workers", workers},
                                        {"pass1_samples_per_second", first}, {"pass2_samples_per_second", second}}
                             .dump());
    } else {
      fmt::print(" {:>8} {:>16.0f} {:>16.0f}\n", workers, first, second);
    }
  }
}

void bench_loader(const BenchLoaderOptions& o) {
  KILN_CHECK(!o.data_path.empty(), "--data-path is required");
  if (Storage::defaults().exists(o.data_path + "/metadata.json")) return bench_csv(o);
  KILN_CHECK(o.batches > 0 && o.micro_batch_size > 0 && o.seq_length > 0,
             "--batches, --micro-batch-size and --seq-length must be positive");
  const std::unique_ptr<Backend> backend = make_backend(o.device, {});
  if (!o.json) {
    fmt::print("# kiln bench loader | {} | {} | batches of {} x {} tokens | {} batches read twice{}\n", o.data_path,
               backend->description(), o.micro_batch_size, o.seq_length, o.batches,
               o.model_iters > 0 ? fmt::format(" | data wait over {} steps of a {}-layer, {}-wide GPT", o.model_iters,
                                               o.model_layers, o.model_hidden)
                                 : "");
    fmt::print("#{:>8} {:>6} {:>8} {:>8} {:>4} {:>14} {:>10} {:>14} {:>10} {:>10}\n", "storage", "cache", "workers",
               "prefetch", "pin", "pass 1 samp/s", "MB/s", "pass 2 samp/s", "MB/s", "data wait");
  }
  const size_t ints = 2 * static_cast<size_t>(o.micro_batch_size * o.seq_length);
  const double mb_per_batch = static_cast<double>(ints * sizeof(int32_t)) / 1e6;
  for (const std::string& storage_name : o.storage) {
    const StorageChoice choice = storage_choice(o, storage_name);
    for (int64_t cache : o.cache) {
      for (int workers : o.workers) {
        for (int prefetch : o.prefetch) {
          for (int pin : o.pin_memory) {
            // A fresh Storage per row: an s3-cache row starts from whatever the cache folder holds.
            const Storage storage(choice.options);
            const std::unique_ptr<TokenSource> source = open_source(o, choice, storage);
            DataLoader loader(*source, o.micro_batch_size, {workers, prefetch, cache});
            const auto stager = backend->make_batch_stager({ints, 2, pin != 0, true});
            double seconds[2];
            for (int pass = 0; pass < 2; ++pass) {
              const auto start = std::chrono::steady_clock::now();
              for (int64_t b = 0; b < o.batches; ++b) {
                const std::span<int32_t> slot = stager->next_host_slot();
                loader.next_into(b * o.micro_batch_size, slot.first(ints / 2), slot.subspan(ints / 2));
                stager->release(stager->submit());
              }
              backend->synchronize();
              seconds[pass] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            }
            const double wait = o.model_iters > 0 ? data_wait_share(o, choice, workers, prefetch, cache, pin != 0) : -1;
            const double samples = static_cast<double>(o.batches * o.micro_batch_size);
            const double mb = static_cast<double>(o.batches) * mb_per_batch;
            if (o.json) {
              nlohmann::json row{{"data_path", choice.path}, {"storage", storage_name}, {"device", o.device},
                                 {"cache_samples", cache}, {"workers", workers}, {"prefetch_factor", prefetch},
                                 {"pin_memory", pin != 0}, {"pass1_samples_per_second", samples / seconds[0]},
                                 {"pass2_samples_per_second", samples / seconds[1]},
                                 {"pass1_mb_per_second", mb / seconds[0]}, {"pass2_mb_per_second", mb / seconds[1]}};
              if (wait >= 0) row["data_wait_share"] = wait;
              fmt::print("{}\n", row.dump());
            } else {
              fmt::print(" {:>8} {:>6} {:>8} {:>8} {:>4} {:>14.0f} {:>10.1f} {:>14.0f} {:>10.1f} {:>10}\n",
                         storage_name, cache, workers, prefetch, pin, samples / seconds[0], mb / seconds[0],
                         samples / seconds[1], mb / seconds[1], wait >= 0 ? fmt::format("{:.2f}%", 100 * wait) : "-");
            }
            std::fflush(stdout);
          }
        }
      }
    }
  }
}

}  // namespace

void add_bench_loader_command(CLI::App& bench) {
  auto o = std::make_shared<BenchLoaderOptions>();
  CLI::App* loader = bench.add_subcommand("loader", "measure data loading: storage x cache x workers x prefetch x pin");
  loader->add_option("--data-path", o->data_path,
                     "shard folder, Megatron prefix, classification CSV folder, or raw-text .csv/.jsonl file or folder (local)")
      ->required();
  loader->add_option("--s3-path", o->s3_path, "the same data on S3 (s3://bucket/key), for --storage s3, s3-cache");
  loader->add_option("--cache-dir", o->cache_dir, "cache folder for --storage s3-cache");
  loader->add_option("--storage", o->storage, "storages to sweep: mmap, pread, s3, s3-cache")->delimiter(',');
  loader->add_option("--vocab-size", o->vocab_size, "vocabulary (default: the shards' meta.json)");
  loader->add_option("--split", o->split, "document split for indexed data");
  loader->add_option("--seq-length", o->seq_length, "tokens per sample");
  loader->add_option("--micro-batch-size", o->micro_batch_size, "samples per batch");
  loader->add_option("--batches", o->batches, "batches per pass");
  loader->add_option("--workers", o->workers, "worker counts to sweep")->delimiter(',');
  loader->add_option("--prefetch-factor", o->prefetch, "batches queued per worker, to sweep")->delimiter(',');
  loader->add_option("--cache", o->cache, "decoded-sample cache sizes to sweep")->delimiter(',');
  loader->add_option("--pin-memory", o->pin_memory, "0 and/or 1: pageable or page-locked staging (CUDA)")
      ->delimiter(',');
  loader->add_option("--device", o->device, "where batches are staged: cpu or cuda");
  loader->add_option("--model-iters", o->model_iters, "also train a small GPT this many steps per row (data wait)");
  loader->add_option("--model-layers", o->model_layers, "layers of that GPT");
  loader->add_option("--model-hidden", o->model_hidden, "hidden size of that GPT");
  loader->add_option("--model-heads", o->model_heads, "attention heads of that GPT");
  o->tokenizer_dir = default_gpt2_tokenizer_dir();
  loader->add_option("--tokenizer-dir", o->tokenizer_dir, "GPT-2's encoder.json and vocab.bpe, for text data");
  loader->add_option("--text-key", o->text_key, "text data: the text's column or key");
  loader->add_option("--label-key", o->label_key, "text data: the label's column or key");
  loader->add_option("--num-labels", o->num_labels, "text data: labels are in [0, N)");
  loader->add_flag("--json", o->json, "JSON lines instead of the table");
  loader->callback([o] { bench_loader(*o); });
}

}  // namespace kiln::cli
