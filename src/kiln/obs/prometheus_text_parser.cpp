#include "kiln/obs/prometheus_text_parser.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "kiln/core/error.h"

namespace kiln {
namespace {

constexpr size_t kQuotedLineLength = 80;

bool name_start(char c, bool colon_allowed) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || (colon_allowed && c == ':');
}

bool name_char(char c, bool colon_allowed) {
  return name_start(c, colon_allowed) || std::isdigit(static_cast<unsigned char>(c));
}

// A number as the format writes one: decimal with an optional sign and exponent, or NaN, Inf,
// Infinity with any case and sign. std::from_chars takes all of these but a leading '+'.
std::optional<double> parse_value(std::string_view token) {
  std::string_view digits = token;
  if (digits.starts_with('+')) digits.remove_prefix(1);
  if (digits.empty() || digits.starts_with('+')) return std::nullopt;
  double value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return value;
}

// One line of the page, read left to right; every failure names the line.
class LineReader {
 public:
  LineReader(std::string_view line, size_t number) : line_(line), number_(number) {}

  PrometheusSample sample() {
    PrometheusSample sample;
    sample.name = name(true, "a sample must start with a metric name");
    const bool blank_after_name = skip_blanks() > 0;
    if (peek() == '{') {
      sample.labels = labels();
      skip_blanks();
    } else {
      KILN_CHECK(blank_after_name || at_end(), "{}",
                 failure("expected a space or '{' after the metric name"));
    }
    KILN_CHECK(!at_end(), "{}", failure("a sample needs a value"));
    const std::string_view value = token();
    const std::optional<double> parsed = parse_value(value);
    KILN_CHECK(parsed.has_value(), "{}", failure(fmt::format("'{}' is not a number", value)));
    sample.value = *parsed;
    skip_blanks();
    if (!at_end()) sample.timestamp_ms = timestamp();
    skip_blanks();
    KILN_CHECK(at_end(), "{}", failure("unexpected text after the sample"));
    return sample;
  }

 private:
  std::vector<std::pair<std::string, std::string>> labels() {
    std::vector<std::pair<std::string, std::string>> labels;
    ++position_;  // '{'
    skip_blanks();
    while (peek() != '}') {
      std::string label = name(false, "expected a label name or '}'");
      KILN_CHECK(std::none_of(labels.begin(), labels.end(),
                              [&](const auto& earlier) { return earlier.first == label; }),
                 "{}", failure(fmt::format("label '{}' appears twice", label)));
      skip_blanks();
      expect('=', fmt::format("expected '=' after label name '{}'", label));
      skip_blanks();
      labels.emplace_back(std::move(label), quoted_value());
      skip_blanks();
      if (peek() == ',') {
        ++position_;
        skip_blanks();
      } else {
        KILN_CHECK(peek() == '}', "{}", failure("expected ',' or '}' after a label value"));
      }
    }
    ++position_;  // '}'
    return labels;
  }

  std::string quoted_value() {
    expect('"', "a label value must be in double quotes");
    std::string value;
    while (true) {
      KILN_CHECK(!at_end(), "{}", failure("a label value's closing '\"' is missing"));
      const char c = line_[position_++];
      if (c == '"') return value;
      if (c != '\\') {
        value += c;
        continue;
      }
      const char escaped = at_end() ? '\0' : line_[position_++];
      if (escaped == '\\' || escaped == '"')
        value += escaped;
      else if (escaped == 'n')
        value += '\n';
      else
        fail("{}", failure("a label value may only escape \\\\, \\\" and \\n"));
    }
  }

  int64_t timestamp() {
    const std::string_view text = token();
    int64_t milliseconds = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), milliseconds);
    KILN_CHECK(error == std::errc() && end == text.data() + text.size(), "{}",
               failure(fmt::format("'{}' is not a timestamp in milliseconds", text)));
    return milliseconds;
  }

  std::string name(bool colon_allowed, std::string_view what_was_expected) {
    const size_t start = position_;
    KILN_CHECK(name_start(peek(), colon_allowed), "{}", failure(what_was_expected));
    while (name_char(peek(), colon_allowed)) ++position_;
    return std::string(line_.substr(start, position_ - start));
  }

  std::string_view token() {
    const size_t start = position_;
    while (!at_end() && peek() != ' ' && peek() != '\t') ++position_;
    return line_.substr(start, position_ - start);
  }

  void expect(char c, std::string_view what_was_expected) {
    KILN_CHECK(peek() == c, "{}", failure(what_was_expected));
    ++position_;
  }

  size_t skip_blanks() {
    const size_t start = position_;
    while (peek() == ' ' || peek() == '\t') ++position_;
    return position_ - start;
  }

  bool at_end() const { return position_ == line_.size(); }
  char peek() const { return at_end() ? '\0' : line_[position_]; }

  std::string failure(std::string_view what) const {
    const std::string_view shown = line_.substr(0, kQuotedLineLength);
    return fmt::format("Prometheus text, line {}: {}: {}{}", number_, what, shown,
                       shown.size() < line_.size() ? "..." : "");
  }

  std::string_view line_;
  size_t number_;
  size_t position_ = 0;
};

}  // namespace

const std::string* PrometheusSample::label(std::string_view label_name) const {
  for (const auto& [name, value] : labels)
    if (name == label_name) return &value;
  return nullptr;
}

std::vector<PrometheusSample> parse_prometheus_text(std::string_view text) {
  std::vector<PrometheusSample> samples;
  size_t number = 0;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    ++number;
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos || line[first] == '#') continue;
    samples.push_back(LineReader(line.substr(first), number).sample());
  }
  return samples;
}

}  // namespace kiln
