// safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON mapping each tensor name to {dtype, shape, data_offsets: [begin,
// end)} (plus an optional "__metadata__" map of strings), then the raw little-endian data.
//
// write_safetensors writes atomically (core/atomic_file.h) and records a 64-bit checksum of each
// tensor's bytes in the metadata ("kiln.hash64.<name>": 16 hex digits; core/rng.h hash_bytes).
// SafetensorsFile maps a file and validates it fully on open (header length, JSON, dtypes, every
// tensor's byte range against its shape and the file size, no overlaps, and the checksums a file
// carries, so a flipped bit in a kiln-written file is found; other writers' files have none);
// errors name the file and the tensor. metadata() holds what the writer passed, not the checksums.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/storage/mapped_file.h"

namespace kiln {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;  // host memory, shape.numel() * dtype_size(dtype) bytes, in a file
                               // at any alignment (the header may have any length)
};

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // The named tensor; an error naming file and tensor when it is absent.
  const SafetensorsEntry& get(const std::string& name) const;
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  MappedFile file_;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kiln
