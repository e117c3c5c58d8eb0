#include "kiln/data/gpt_dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/core/rng.h"

namespace kiln {
namespace fs = std::filesystem;
namespace {

template <typename T>
void shuffle_in_place(std::vector<T>& values, uint64_t seed) {
  Rng rng(seed);
  for (size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[rng.below(i)]);
}

// Index caches hold the array's bytes and then hash_bytes of them: a file that is damaged, cut
// short or written by another version fails the check and is built again.
template <typename T>
bool load_array(const std::string& path, size_t count, std::vector<T>& out) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream.good()) return false;
  out.resize(count);
  const auto bytes = static_cast<std::streamsize>(count * sizeof(T));
  uint64_t checksum = 0;
  stream.read(reinterpret_cast<char*>(out.data()), bytes);
  stream.read(reinterpret_cast<char*>(&checksum), sizeof(checksum));
  return stream.gcount() == sizeof(checksum) && stream.peek() == EOF &&
         checksum == hash_bytes(out.data(), static_cast<size_t>(bytes));
}

template <typename T>
void save_array(const std::string& path, const std::vector<T>& values) {
  const uint64_t checksum = hash_bytes(values.data(), values.size() * sizeof(T));
  AtomicFile file(path);
  file.write(values.data(), values.size() * sizeof(T));
  file.write(&checksum, sizeof(checksum));
  file.commit();
}

}  // namespace

std::vector<double> parse_split(const std::string& split) {
  std::vector<double> weights;
  std::stringstream stream(split);
  std::string part;
  while (std::getline(stream, part, ',')) {
    try {
      size_t used = 0;
      const double weight = std::stod(part, &used);
      KILN_CHECK(used == part.size() && weight >= 0 && std::isfinite(weight), "bad");
      weights.push_back(weight);
    } catch (const std::exception&) {
      fail("config key 'split': '{}' is not a list of non-negative numbers like 949,50,1", split);
    }
  }
  KILN_CHECK(!weights.empty() && weights.size() <= 3, "config key 'split': '{}' needs one to three weights", split);
  weights.resize(3, 0.0);
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  KILN_CHECK(total > 0, "config key 'split': '{}' sums to zero", split);
  for (double& weight : weights) weight /= total;
  return weights;
}

std::vector<std::pair<int64_t, int64_t>> split_ranges(const std::vector<double>& weights, int64_t documents) {
  std::vector<int64_t> bounds = {0};
  for (double weight : weights)
    bounds.push_back(bounds.back() + static_cast<int64_t>(std::round(weight * static_cast<double>(documents))));
  const int64_t excess = bounds.back() - documents;  // rounding may over- or undershoot by a little
  for (size_t i = 1; i < bounds.size(); ++i) bounds[i] = std::max<int64_t>(0, bounds[i] - excess);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) ranges.emplace_back(bounds[i], bounds[i + 1]);
  return ranges;
}

DataBlend parse_data_path(const std::string& data_path) {
  std::istringstream stream(data_path);
  std::vector<std::string> words{std::istream_iterator<std::string>(stream), {}};
  KILN_CHECK(!words.empty(), "config key 'data_path' is empty");
  DataBlend blend;
  if (words.size() == 1) {
    blend.weights = {1.0};
    blend.prefixes = words;
    return blend;
  }
  KILN_CHECK(words.size() % 2 == 0, "config key 'data_path': '{}' must be one prefix or weight/prefix pairs",
             data_path);
  for (size_t i = 0; i < words.size(); i += 2) {
    double weight = -1;
    try {
      size_t used = 0;
      weight = std::stod(words[i], &used);
      if (used != words[i].size()) weight = -1;
    } catch (const std::exception&) {
    }
    KILN_CHECK(weight > 0 && std::isfinite(weight), "config key 'data_path': weight '{}' of '{}' is not a positive number",
               words[i], words[i + 1]);
    blend.weights.push_back(weight);
    blend.prefixes.push_back(words[i + 1]);
  }
  const double total = std::accumulate(blend.weights.begin(), blend.weights.end(), 0.0);
  for (double& weight : blend.weights) weight /= total;
  return blend;
}

bool is_indexed_data_path(const std::string& data_path, const Storage& storage) {
  std::istringstream stream(data_path);
  std::vector<std::string> words{std::istream_iterator<std::string>(stream), {}};
  if (words.size() > 1) return true;
  return words.size() == 1 && storage.exists(words[0] + ".idx");
}

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> data, const std::string& prefix,
                       std::pair<int64_t, int64_t> documents, int64_t seq_length, int64_t num_samples, uint64_t seed,
                       const Storage& storage)
    : data_(std::move(data)), seq_length_(seq_length) {
  const auto [first, last] = documents;
  KILN_CHECK(last > first, "{}: the split holds no documents ({} in the dataset)", prefix, data_->num_documents());
  KILN_CHECK(num_samples > 0 || num_samples == kWholeSplit, "{}: no samples requested", prefix);
  const std::vector<int64_t>& bounds = data_->document_boundaries();
  std::vector<int64_t> document_tokens(static_cast<size_t>(last - first), 0);
  for (int64_t d = first; d < last; ++d)
    for (int64_t s = bounds[static_cast<size_t>(d)]; s < bounds[static_cast<size_t>(d) + 1]; ++s)
      document_tokens[static_cast<size_t>(d - first)] += data_->sequence_length(s);
  tokens_per_epoch_ = std::accumulate(document_tokens.begin(), document_tokens.end(), int64_t{0});
  KILN_CHECK(tokens_per_epoch_ > seq_length, "{}: the split has {} tokens, fewer than one sample of {}", prefix,
             tokens_per_epoch_, seq_length + 1);
  if (num_samples == kWholeSplit) {  // every window that fits in one epoch (sample s from token s x seq_length)
    num_samples = (tokens_per_epoch_ - 1) / seq_length;
    whole_split_ = true;
  }
  int64_t epochs = 1;
  while ((epochs * tokens_per_epoch_ - 1) / seq_length < num_samples) ++epochs;

  const std::string cache_dir = storage.derived_folder(prefix, "_kiln_cache");  // "" for S3 without cache_dir
  const uint64_t key =
      mix64(hash_string(storage.fingerprint(prefix + ".idx")) ^
            mix64(static_cast<uint64_t>(first) * 31 + static_cast<uint64_t>(last)) ^
            mix64(static_cast<uint64_t>(seq_length) << 20 ^ static_cast<uint64_t>(num_samples)) ^
            mix64(seed + 0x51));
  const std::string stem = fmt::format("{}/{:016x}", cache_dir, key);
  const size_t order_size = static_cast<size_t>(epochs * (last - first));
  if (cache_dir.empty() || !load_array(stem + "_document_order.bin", order_size, document_order_) ||
      !load_array(stem + "_shuffle.bin", static_cast<size_t>(num_samples), shuffle_)) {
    document_order_.clear();
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      std::vector<int32_t> order(static_cast<size_t>(last - first));
      std::iota(order.begin(), order.end(), static_cast<int32_t>(first));
      shuffle_in_place(order, mix64(seed) ^ mix64(static_cast<uint64_t>(epoch) + 1));
      document_order_.insert(document_order_.end(), order.begin(), order.end());
    }
    shuffle_.resize(static_cast<size_t>(num_samples));
    std::iota(shuffle_.begin(), shuffle_.end(), int64_t{0});
    shuffle_in_place(shuffle_, mix64(seed ^ 0x5348554646ull));
    if (!cache_dir.empty()) {
      fs::create_directories(cache_dir);
      save_array(stem + "_document_order.bin", document_order_);
      save_array(stem + "_shuffle.bin", shuffle_);
    }
  }
  document_starts_.resize(document_order_.size());
  int64_t offset = 0;
  for (size_t i = 0; i < document_order_.size(); ++i) {
    KILN_CHECK(document_order_[i] >= first && document_order_[i] < last, "{}: corrupt cache entry in {}", prefix,
               cache_dir);
    document_starts_[i] = offset;
    offset += document_tokens[static_cast<size_t>(document_order_[i] - first)];
  }
}

std::optional<int64_t> GptDataset::distinct_samples() const {
  return whole_split_ ? std::optional<int64_t>(num_samples()) : std::nullopt;
}

void GptDataset::plan_window(int64_t index, std::vector<IndexedDataset::TokenRange>& ranges) const {
  const int64_t sample = shuffle_[static_cast<size_t>(index % num_samples())];
  const int64_t position = sample * seq_length_;  // token offset in the concatenated epochs
  size_t entry = static_cast<size_t>(std::upper_bound(document_starts_.begin(), document_starts_.end(), position) -
                                     document_starts_.begin() - 1);
  int64_t offset = position - document_starts_[entry];
  int64_t planned = 0;
  const std::vector<int64_t>& bounds = data_->document_boundaries();
  while (planned < seq_length_ + 1) {
    const int64_t document = document_order_[entry];
    for (int64_t s = bounds[static_cast<size_t>(document)]; s < bounds[static_cast<size_t>(document) + 1]; ++s) {
      const int64_t length = data_->sequence_length(s);
      if (offset >= length) {
        offset -= length;
        continue;
      }
      const int64_t take = std::min(length - offset, seq_length_ + 1 - planned);
      ranges.push_back({s, offset, take});
      planned += take;
      offset = 0;
      if (planned == seq_length_ + 1) break;
    }
    offset = 0;
    ++entry;
  }
}

void GptDataset::sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const {
  samples(std::span(&index, 1), tokens, targets);
}

void GptDataset::samples(std::span<const int64_t> indices, std::span<int32_t> tokens,
                         std::span<int32_t> targets) const {
  check_rows(indices.size(), tokens, targets);
  const auto seq = static_cast<size_t>(seq_length_);
  thread_local std::vector<IndexedDataset::TokenRange> ranges;
  thread_local std::vector<int32_t> windows;  // seq_length + 1 tokens per sample
  ranges.clear();
  for (const int64_t index : indices) plan_window(index, ranges);
  windows.resize(indices.size() * (seq + 1));
  data_->read_many(ranges, windows);
  for (size_t row = 0; row < indices.size(); ++row) {
    const int32_t* window = windows.data() + row * (seq + 1);
    std::copy(window, window + seq, tokens.begin() + static_cast<std::ptrdiff_t>(row * seq));
    std::copy(window + 1, window + seq + 1, targets.begin() + static_cast<std::ptrdiff_t>(row * seq));
  }
}

BlendedTokens::BlendedTokens(std::vector<std::unique_ptr<GptDataset>> datasets, const std::vector<double>& weights,
                             int64_t num_samples)
    : datasets_(std::move(datasets)) {
  std::vector<int64_t> counts(datasets_.size(), 0);
  for (int64_t i = 0; i < num_samples; ++i) {
    // The dataset whose share is furthest below its weight gets the sample (ties: the first).
    size_t best = 0;
    double best_error = -1e300;
    for (size_t d = 0; d < datasets_.size(); ++d) {
      const double error = weights[d] * static_cast<double>(i + 1) - static_cast<double>(counts[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    dataset_of_.push_back(static_cast<int16_t>(best));
    sample_in_dataset_.push_back(counts[best]++);
  }
}

int64_t BlendedTokens::num_tokens() const {
  int64_t total = 0;
  for (const auto& dataset : datasets_) total += dataset->num_tokens();
  return total;
}

void BlendedTokens::sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const {
  const size_t i = static_cast<size_t>(index % static_cast<int64_t>(dataset_of_.size()));
  datasets_[static_cast<size_t>(dataset_of_[i])]->sample(sample_in_dataset_[i], tokens, targets);
}

void BlendedTokens::samples(std::span<const int64_t> indices, std::span<int32_t> tokens,
                            std::span<int32_t> targets) const {
  check_rows(indices.size(), tokens, targets);
  const auto seq = static_cast<size_t>(seq_length());
  for (size_t d = 0; d < datasets_.size(); ++d) {
    std::vector<size_t> rows;
    std::vector<int64_t> local;
    for (size_t row = 0; row < indices.size(); ++row) {
      const size_t i = static_cast<size_t>(indices[row] % static_cast<int64_t>(dataset_of_.size()));
      if (static_cast<size_t>(dataset_of_[i]) != d) continue;
      rows.push_back(row);
      local.push_back(sample_in_dataset_[i]);
    }
    if (rows.empty()) continue;
    std::vector<int32_t> member_tokens(rows.size() * seq), member_targets(rows.size() * seq);
    datasets_[d]->samples(local, member_tokens, member_targets);
    for (size_t r = 0; r < rows.size(); ++r) {
      std::copy_n(member_tokens.begin() + static_cast<std::ptrdiff_t>(r * seq), seq,
                  tokens.begin() + static_cast<std::ptrdiff_t>(rows[r] * seq));
      std::copy_n(member_targets.begin() + static_cast<std::ptrdiff_t>(r * seq), seq,
                  targets.begin() + static_cast<std::ptrdiff_t>(rows[r] * seq));
    }
  }
}

std::unique_ptr<TokenSource> make_gpt_data(const std::string& data_path, const std::string& split, DataSplit which,
                                           int64_t vocab_size, int64_t seq_length, int64_t num_samples, uint64_t seed,
                                           const Storage& storage) {
  const DataBlend blend = parse_data_path(data_path);
  KILN_CHECK(num_samples != GptDataset::kWholeSplit || blend.prefixes.size() == 1,
             "config key 'eval_whole_split' is set, but data_path '{}' blends {} datasets, whose samples are drawn by "
             "weight without end (no fixed set to read once); validate one dataset whole, or leave it out and set "
             "--eval-iters",
             data_path, blend.prefixes.size());
  const std::vector<double> weights = parse_split(split);
  std::vector<std::unique_ptr<GptDataset>> datasets;
  for (size_t d = 0; d < blend.prefixes.size(); ++d) {
    auto data = std::make_shared<const IndexedDataset>(blend.prefixes[d], vocab_size, storage);
    const auto range = split_ranges(weights, data->num_documents())[static_cast<size_t>(which)];
    // Megatron asks each blended dataset for its share plus 0.5%, so rounding never runs short.
    const auto share = static_cast<int64_t>(std::ceil(blend.weights[d] * static_cast<double>(num_samples) * 1.005)) + 1;
    datasets.push_back(std::make_unique<GptDataset>(std::move(data), blend.prefixes[d], range, seq_length,
                                                    blend.prefixes.size() == 1 ? num_samples : share, seed, storage));
  }
  if (datasets.size() == 1) return std::move(datasets.front());
  return std::make_unique<BlendedTokens>(std::move(datasets), blend.weights, num_samples);
}

}  // namespace kiln
