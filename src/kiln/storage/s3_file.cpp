#include "kiln/storage/s3_file.h"

#include <algorithm>

#include "kiln/core/error.h"

namespace kiln {

S3File::S3File(std::shared_ptr<const S3Client> client, const std::string& uri, uint64_t part_bytes)
    : client_(std::move(client)), uri_(uri), location_(parse_s3_uri(uri)), part_bytes_(std::max<uint64_t>(1, part_bytes)) {
  KILN_CHECK(!location_.key.empty(), "'{}' names a bucket, not an object", uri);
  const std::optional<S3ObjectInfo> info = client_->head(location_);
  KILN_CHECK(info.has_value(), "{}: not found (HTTP 404: no such object)", uri);
  info_ = *info;
}

void S3File::read(uint64_t offset, std::span<uint8_t> out) const {
  const ReadRange range{offset, out};
  read_many({&range, 1});
}

void S3File::read_many(std::span<const ReadRange> ranges) const {
  std::vector<S3RangeRead> parts;
  for (const ReadRange& range : ranges) {
    check_range(range.offset, range.out.size());
    for (uint64_t done = 0; done < range.out.size(); done += part_bytes_) {
      const uint64_t bytes = std::min<uint64_t>(part_bytes_, range.out.size() - done);
      parts.push_back({range.offset + done, range.out.subspan(done, bytes)});
    }
  }
  client_->read_ranges(location_, parts);
}

}  // namespace kiln
