// Local files behind RandomAccessFile: PreadFile reads with pread(2) on one descriptor (the page
// cache does the caching; good on parallel file systems, where a map's page faults are costly);
// MmapFile maps the file read-only once and copies out of the map (zero system calls per read).
#pragma once

#include <memory>
#include <string>

#include "kiln/storage/random_access_file.h"

namespace kiln {

std::unique_ptr<RandomAccessFile> open_pread_file(const std::string& path);
std::unique_ptr<RandomAccessFile> open_mmap_file(const std::string& path);

}  // namespace kiln
