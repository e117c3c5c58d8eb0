// An S3 object behind RandomAccessFile: size and ETag from one HEAD on open, reads as ranged GETs.
// A read larger than part_bytes is split into parts fetched concurrently (several ranges in
// flight, S3Settings::max_in_flight); read_many() sends all its ranges at once.
#pragma once

#include <memory>

#include "kiln/storage/random_access_file.h"
#include "kiln/storage/s3_client.h"

namespace kiln {

class S3File final : public RandomAccessFile {
 public:
  // Errors name the URI: no such object (404), access denied (403), unreachable endpoint.
  S3File(std::shared_ptr<const S3Client> client, const std::string& uri, uint64_t part_bytes = 8ull << 20);

  const std::string& name() const override { return uri_; }
  uint64_t size() const override { return info_.size; }
  const std::string& etag() const { return info_.etag; }
  void read(uint64_t offset, std::span<uint8_t> out) const override;
  void read_many(std::span<const ReadRange> ranges) const override;

 private:
  std::shared_ptr<const S3Client> client_;
  std::string uri_;
  S3Location location_;
  S3ObjectInfo info_;
  uint64_t part_bytes_;
};

}  // namespace kiln
