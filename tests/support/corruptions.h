// Corrupted copies of a valid input file, and the check every reader of user input must pass on
// them: it accepts the bytes or throws a kiln::Error whose message names the culprit, and nothing
// else (no other exception, no crash, no hang; under -DKILN_SANITIZE=address,undefined also no
// out-of-bounds read and no undefined behaviour).
//
// corruptions_of(valid, options) makes, deterministically from a seed:
//   - truncations: every length for the first `header_bytes` bytes, then seeded lengths;
//   - header integers: each 4- and 8-byte little-endian extreme value (0, -1, the signed limits,
//     powers of two near 2^31, 2^32, 2^40, 2^62, the file's size) written at every offset of the
//     first `header_bytes` bytes, aligned or not, so every count, length and offset field of a
//     binary header gets each value;
//   - seeded edits anywhere: a flipped bit, a byte set to 0x00/0x7f/0x80/0xff, random bytes
//     appended;
//   - for text formats, seeded edits of the text: a span deleted or repeated, a number replaced
//     by an extreme one ("-1", "99999999999999999999", "1e400", "nan", ...), a structural
//     character (quote, bracket, comma, colon, newline, NUL, an invalid UTF-8 byte) inserted.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/rng.h"
#include "support/temp_dir.h"

namespace kiln::testing {

struct Corruption {
  std::string what;   // how the bytes were changed, for the failure message
  std::string bytes;
};

struct CorruptionOptions {
  uint64_t seed = 1;
  size_t header_bytes = 64;  // prefix given every truncation and every extreme integer
  int random_edits = 200;    // seeded edits anywhere in the file
  bool text = false;         // also edit it as text
};

namespace corruption_detail {

inline std::string overwritten(std::string bytes, size_t at, uint64_t value, size_t width) {
  for (size_t i = 0; i < width && at + i < bytes.size(); ++i) bytes[at + i] = static_cast<char>(value >> (8 * i));
  return bytes;
}

inline std::vector<uint64_t> extreme_integers(size_t file_size) {
  return {0,
          ~uint64_t{0},                      // -1
          0x7fffffffull,                     // INT32_MAX
          0x80000000ull,                     // INT32_MIN as u32, 2^31
          0xffffffffull,
          uint64_t{1} << 32,
          uint64_t{1} << 40,
          uint64_t{1} << 62,
          0x7fffffffffffffffull,             // INT64_MAX
          0x8000000000000000ull,             // INT64_MIN
          static_cast<uint64_t>(file_size),
          static_cast<uint64_t>(file_size) + 1};
}

// Start and length of a digit run containing position `at`, if there is one there.
inline bool number_at(const std::string& text, size_t at, size_t& begin, size_t& length) {
  if (at >= text.size() || !std::isdigit(static_cast<unsigned char>(text[at]))) return false;
  begin = at;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(text[begin - 1]))) --begin;
  size_t end = at;
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  length = end - begin;
  return true;
}

inline void add_text_edits(const std::string& valid, Rng& rng, int count, std::vector<Corruption>& out) {
  static const char* const kNumbers[] = {"-1", "0", "99999999999999999999", "9223372036854775808",
                                         "1e400", "-1e400", "nan", "inf", "0.5", "1e-400", ""};
  static const std::string kInserts[] = {"\"", "{", "}", "[", "]", ",", ":", "\n", std::string(1, '\0'),
                                         "\xff", "\xc3", "-", ".", "#", "'", "\\", " "};
  const size_t size = valid.size();
  for (int i = 0; i < count && size > 0; ++i) {
    const size_t at = rng.below(size);
    const size_t span = 1 + rng.below(std::min<size_t>(size - at, 16));
    switch (rng.below(4)) {
      case 0:
        out.push_back({"deleted " + std::to_string(span) + " bytes at " + std::to_string(at),
                       valid.substr(0, at) + valid.substr(at + span)});
        break;
      case 1:
        out.push_back({"repeated " + std::to_string(span) + " bytes at " + std::to_string(at),
                       valid.substr(0, at + span) + valid.substr(at)});
        break;
      case 2: {
        // The nearest number at or after `at`, replaced by an extreme one.
        size_t begin = 0, length = 0, probe = at;
        while (probe < size && !number_at(valid, probe, begin, length)) ++probe;
        if (probe == size) break;
        const std::string number = kNumbers[rng.below(std::size(kNumbers))];
        out.push_back({"number at " + std::to_string(begin) + " replaced by '" + number + "'",
                       valid.substr(0, begin) + number + valid.substr(begin + length)});
        break;
      }
      default: {
        const std::string& insert = kInserts[rng.below(std::size(kInserts))];
        out.push_back({"inserted byte " + std::to_string(static_cast<unsigned char>(insert[0])) + " at " +
                           std::to_string(at),
                       valid.substr(0, at) + insert + valid.substr(at)});
      }
    }
  }
}

}  // namespace corruption_detail

inline std::vector<Corruption> corruptions_of(const std::string& valid, const CorruptionOptions& options) {
  using namespace corruption_detail;
  std::vector<Corruption> out;
  Rng rng(options.seed);
  const size_t size = valid.size();
  const size_t header = std::min(options.header_bytes, size);
  for (size_t length = 0; length < header; ++length)
    out.push_back({"truncated to " + std::to_string(length) + " bytes", valid.substr(0, length)});
  for (int i = 0; i < 16 && size > header; ++i) {
    const size_t length = header + rng.below(size - header);
    out.push_back({"truncated to " + std::to_string(length) + " bytes", valid.substr(0, length)});
  }
  if (!options.text)
    for (uint64_t value : extreme_integers(size))
      for (size_t width : {size_t{4}, size_t{8}})
        for (size_t at = 0; at + width <= header; ++at)
          out.push_back({std::to_string(width) + "-byte integer " + std::to_string(value) + " at " + std::to_string(at),
                         overwritten(valid, at, value, width)});
  static const unsigned char kBytes[] = {0x00, 0x7f, 0x80, 0xff};
  for (int i = 0; i < options.random_edits && size > 0; ++i) {
    const size_t at = rng.below(size);
    std::string bytes = valid;
    std::string what;
    switch (rng.below(3)) {
      case 0: {
        const int bit = static_cast<int>(rng.below(8));
        bytes[at] = static_cast<char>(bytes[at] ^ (1 << bit));
        what = "bit " + std::to_string(bit) + " flipped at " + std::to_string(at);
        break;
      }
      case 1:
        bytes[at] = static_cast<char>(kBytes[rng.below(4)]);
        what = "byte " + std::to_string(static_cast<unsigned char>(bytes[at])) + " at " + std::to_string(at);
        break;
      default: {
        const size_t extra = 1 + rng.below(64);
        for (size_t j = 0; j < extra; ++j) bytes.push_back(static_cast<char>(rng.below(256)));
        what = std::to_string(extra) + " random bytes appended";
      }
    }
    out.push_back({what, std::move(bytes)});
  }
  if (options.text) add_text_edits(valid, rng, options.random_edits, out);
  return out;
}

// How a reader fared on a set of corruptions.
struct CorruptionTally {
  int accepted = 0, rejected = 0;
};

// Writes each corruption over `path` (restoring the valid bytes afterwards) and runs `open`, which
// must either return or throw a kiln::Error naming `culprit`. Every other outcome is a test
// failure that says which corruption caused it.
template <typename Open>
CorruptionTally expect_rejected_by_name_or_accepted(const std::string& path, const std::vector<Corruption>& corruptions,
                                                    const std::string& culprit, Open open) {
  const std::string valid = read_file_bytes(path);
  CorruptionTally tally;
  for (const Corruption& corruption : corruptions) {
    write_file_bytes(path, corruption.bytes);
    try {
      open();
      ++tally.accepted;
    } catch (const Error& error) {
      ++tally.rejected;
      EXPECT_NE(std::string(error.what()).find(culprit), std::string::npos)
          << path << " " << corruption.what << ": the error does not name " << culprit << ": " << error.what();
    } catch (const std::exception& error) {
      ADD_FAILURE() << path << " " << corruption.what << ": not a kiln::Error: " << error.what();
    }
  }
  write_file_bytes(path, valid);
  return tally;
}

}  // namespace kiln::testing
