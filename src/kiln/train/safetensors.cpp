#include "kiln/train/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/core/json_numbers.h"
#include "kiln/core/rng.h"

namespace kiln {
namespace {

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::U16: return "U16";
    case DType::F8E4M3: return "F8_E4M3";  // the safetensors format's names
    case DType::F8E5M2: return "F8_E5M2";
  }
  return "F32";
}

bool parse_safetensors_dtype(const std::string& name, DType& dtype) {
  for (DType candidate : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::U16})
    if (name == safetensors_dtype(candidate)) {
      dtype = candidate;
      return true;
    }
  return false;
}

// A JSON value that is a whole number in [0, 2^63): shapes' dimensions and byte offsets.
bool is_size(const nlohmann::json& value) {
  const std::optional<int64_t> number = json_int64(value);
  return number && *number >= 0;
}

// The bytes of `shape` elements of `dtype`, or false when the count does not fit 64 bits.
bool tensor_bytes(const Shape& shape, DType dtype, uint64_t& bytes) {
  bytes = dtype_size(dtype);
  for (int d = 0; d < shape.rank; ++d)
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(shape.dims[d]), &bytes)) return false;
  return true;
}

// kiln's checksum of a tensor's bytes, kept in the metadata under this prefix and the tensor's
// name as 16 hex digits (other readers ignore metadata they do not know).
constexpr std::string_view kChecksumPrefix = "kiln.hash64.";

std::string checksum_text(const void* data, size_t bytes) { return fmt::format("{:016x}", hash_bytes(data, bytes)); }

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> all_metadata = metadata;
  for (const SafetensorsEntry& tensor : tensors)
    all_metadata[std::string(kChecksumPrefix) + tensor.name] =
        checksum_text(tensor.data, static_cast<size_t>(tensor.shape.numel()) * dtype_size(tensor.dtype));
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!all_metadata.empty()) header["__metadata__"] = all_metadata;
  size_t offset = 0;
  for (const SafetensorsEntry& tensor : tensors) {
    const size_t bytes = static_cast<size_t>(tensor.shape.numel()) * dtype_size(tensor.dtype);
    std::vector<int64_t> shape(tensor.shape.dims.begin(), tensor.shape.dims.begin() + tensor.shape.rank);
    header[tensor.name] = {{"dtype", safetensors_dtype(tensor.dtype)},
                           {"shape", shape},
                           {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the format pads the header with spaces to 8 bytes
  const uint64_t length = json.size();
  AtomicFile file(path);
  file.write(&length, sizeof(length));
  file.write(json.data(), json.size());
  for (const SafetensorsEntry& tensor : tensors)
    file.write(tensor.data, static_cast<size_t>(tensor.shape.numel()) * dtype_size(tensor.dtype));
  file.commit();
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  KILN_CHECK(file_.size() >= 8, "{}: truncated safetensors file ({} bytes)", path, file_.size());
  uint64_t header_length = 0;
  std::memcpy(&header_length, file_.data(), sizeof(header_length));
  KILN_CHECK(header_length <= file_.size() - 8,
             "{}: header length {} runs past the end of the {}-byte file", path, header_length,
             file_.size());
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file_.data() + 8, file_.data() + 8 + header_length);
  } catch (const nlohmann::json::exception& error) {
    fail("{}: corrupt safetensors header: {}", path, error.what());
  }
  KILN_CHECK(header.is_object(), "{}: safetensors header is not a JSON object", path);
  const uint8_t* data_start = file_.data() + 8 + header_length;
  const size_t data_size = file_.size() - 8 - header_length;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      KILN_CHECK(info.is_object(), "{}: __metadata__ is not an object", path);
      for (const auto& [key, value] : info.items())
        if (value.is_string()) metadata_[key] = value.get<std::string>();
      continue;
    }
    try {
      SafetensorsEntry entry;
      entry.name = name;
      const std::string dtype = info.at("dtype").get<std::string>();
      KILN_CHECK(parse_safetensors_dtype(dtype, entry.dtype), "{}: tensor '{}' has unsupported dtype {}",
                 path, name, dtype);
      const auto shape = info.at("shape").get<std::vector<nlohmann::json>>();
      KILN_CHECK(shape.size() <= Shape::kMaxDims, "{}: tensor '{}' has rank {}", path, name, shape.size());
      for (const nlohmann::json& size : shape) {
        KILN_CHECK(is_size(size), "{}: tensor '{}' has dimension {}, not a size", path, name, size.dump());
        entry.shape.dims[entry.shape.rank++] = size.get<int64_t>();
      }
      const auto offsets = info.at("data_offsets").get<std::vector<nlohmann::json>>();
      KILN_CHECK(offsets.size() == 2 && is_size(offsets[0]) && is_size(offsets[1]),
                 "{}: tensor '{}' data_offsets are not two byte offsets", path, name);
      const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
      KILN_CHECK(begin <= end && end <= data_size,
                 "{}: tensor '{}' data_offsets run past the {} data bytes (truncated file?)", path, name, data_size);
      uint64_t expected = 0;
      KILN_CHECK(tensor_bytes(entry.shape, entry.dtype, expected) && end - begin == expected,
                 "{}: tensor '{}' has shape {} of {} but spans {} bytes", path, name, entry.shape.to_string(), dtype,
                 end - begin);
      entry.data = data_start + begin;
      ranges.emplace_back(begin, end);
      entries_[name] = entry;
    } catch (const nlohmann::json::exception& error) {
      fail("{}: tensor '{}' has a malformed header entry: {}", path, name, error.what());
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    KILN_CHECK(ranges[i].first >= ranges[i - 1].second, "{}: tensors overlap in the data section", path);
  for (auto it = metadata_.begin(); it != metadata_.end();) {
    if (!it->first.starts_with(kChecksumPrefix)) {
      ++it;
      continue;
    }
    const std::string name = it->first.substr(kChecksumPrefix.size());
    const auto entry = entries_.find(name);
    KILN_CHECK(entry != entries_.end(), "{}: metadata holds a checksum of tensor '{}', which the file does not have",
               path, name);
    const SafetensorsEntry& tensor = entry->second;
    KILN_CHECK(it->second == checksum_text(tensor.data, static_cast<size_t>(tensor.shape.numel()) * dtype_size(tensor.dtype)),
               "{}: tensor '{}' fails its checksum: the file was damaged after it was written", path, name);
    it = metadata_.erase(it);  // checked; callers see only the metadata they wrote
  }
}

const SafetensorsEntry& SafetensorsFile::get(const std::string& name) const {
  const auto it = entries_.find(name);
  KILN_CHECK(it != entries_.end(), "{}: tensor '{}' is missing", path(), name);
  return it->second;
}

}  // namespace kiln
