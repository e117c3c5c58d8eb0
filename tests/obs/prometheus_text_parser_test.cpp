// Reading Prometheus's text format back (obs/prometheus_text_parser.h): samples, labels and their
// escapes, histograms, comments, the spellings of numbers, kiln's own page as the registry renders
// it, and malformed text refused with a message that names the line.
#include "kiln/obs/prometheus_text_parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kiln/obs/prometheus_registry.h"
#include "support/error_of.h"

namespace kiln {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;
using testing::error_of;

TEST(PrometheusTextParser, ReadsSamplesWithAndWithoutLabels) {
  const std::vector<PrometheusSample> samples = parse_prometheus_text(
      "demo_up 1\n"
      "demo_temperature_celsius{gpu=\"0\",host=\"node1\"} -3.5\n"
      "  demo:ratio {a=\"x\" , b=\"\",}\t2.5e-3   1700000000123  \n"
      "demo_empty{} 0\n"
      "demo_tight{a=\"1\"}5\n");
  ASSERT_EQ(samples.size(), 5u);
  EXPECT_EQ(samples[0].name, "demo_up");
  EXPECT_EQ(samples[0].labels, Labels{});
  EXPECT_EQ(samples[0].value, 1);
  EXPECT_EQ(samples[0].timestamp_ms, std::nullopt);
  EXPECT_EQ(samples[1].name, "demo_temperature_celsius");
  EXPECT_EQ(samples[1].labels, (Labels{{"gpu", "0"}, {"host", "node1"}}));
  EXPECT_EQ(samples[1].value, -3.5);
  EXPECT_EQ(samples[2].name, "demo:ratio");
  EXPECT_EQ(samples[2].labels, (Labels{{"a", "x"}, {"b", ""}}));
  EXPECT_EQ(samples[2].value, 2.5e-3);
  EXPECT_EQ(samples[2].timestamp_ms, 1700000000123);
  EXPECT_EQ(*samples[1].label("host"), "node1");
  EXPECT_EQ(samples[1].label("rank"), nullptr);
  EXPECT_EQ(samples[3].labels, Labels{});
  EXPECT_EQ(samples[4].labels, (Labels{{"a", "1"}}));  // as Prometheus reads it: no blank needed
  EXPECT_EQ(samples[4].value, 5);
}

TEST(PrometheusTextParser, UnescapesLabelValues) {
  const std::vector<PrometheusSample> samples = parse_prometheus_text(
      R"(demo{path="C:\\dir",quote="say \"hi\"",lines="a\nb",brace="}, {"} 7)");
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(
      samples[0].labels,
      (Labels{{"path", "C:\\dir"}, {"quote", "say \"hi\""}, {"lines", "a\nb"}, {"brace", "}, {"}}));
}

TEST(PrometheusTextParser, SkipsCommentsAndBlankLines) {
  const std::vector<PrometheusSample> samples = parse_prometheus_text(
      "# HELP demo_total Steps { done \"here\n"
      "# TYPE demo_total counter\n"
      "\n"
      "   \t\n"
      "  # a comment after blanks\n"
      "#no space after the hash\n"
      "demo_total 3\n");
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].name, "demo_total");
  EXPECT_EQ(samples[0].value, 3);
}

TEST(PrometheusTextParser, ReadsTheNumbersTheFormatWrites) {
  const std::vector<PrometheusSample> samples = parse_prometheus_text(
      "a +Inf\nb -Inf\nc NaN\nd +1.5\ne 1e3\nf -0\ng 1E-2\nh inf\ni 123456789012\n");
  ASSERT_EQ(samples.size(), 9u);
  EXPECT_EQ(samples[0].value, std::numeric_limits<double>::infinity());
  EXPECT_EQ(samples[1].value, -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(samples[2].value));
  EXPECT_EQ(samples[3].value, 1.5);
  EXPECT_EQ(samples[4].value, 1000);
  EXPECT_EQ(samples[5].value, 0);
  EXPECT_EQ(samples[6].value, 0.01);
  EXPECT_EQ(samples[7].value, std::numeric_limits<double>::infinity());
  EXPECT_EQ(samples[8].value, 123456789012.0);
}

TEST(PrometheusTextParser, ReadsAHistogramAsItsSamples) {
  const std::vector<PrometheusSample> samples = parse_prometheus_text(
      "# TYPE demo_seconds histogram\n"
      "demo_seconds_bucket{rank=\"0\",le=\"0.25\"} 2\n"
      "demo_seconds_bucket{rank=\"0\",le=\"+Inf\"} 3\n"
      "demo_seconds_sum{rank=\"0\"} 4.375\n"
      "demo_seconds_count{rank=\"0\"} 3\n");
  ASSERT_EQ(samples.size(), 4u);
  EXPECT_EQ(*samples[0].label("le"), "0.25");
  EXPECT_EQ(samples[0].value, 2);
  EXPECT_EQ(*samples[1].label("le"), "+Inf");
  EXPECT_EQ(samples[1].value, 3);
  EXPECT_EQ(samples[2].name, "demo_seconds_sum");
  EXPECT_EQ(samples[2].value, 4.375);
  EXPECT_EQ(samples[3].name, "demo_seconds_count");
  EXPECT_EQ(samples[3].value, 3);
}

// What kiln's registry renders (label escapes included) reads back to the same values.
TEST(PrometheusTextParser, ReadsBackWhatTheRegistryRenders) {
  PrometheusRegistry registry({{"rank", "3"}, {"host", "node \"a\"\\b\nc"}});
  const auto steps = registry.add_counter("demo_steps_total", "Steps.\nTwo lines, a \\.");
  const auto duration = registry.add_histogram("demo_duration_seconds", "Times.", {0.5});
  registry.increment(steps, 5);
  registry.observe(duration, 0.25);
  registry.observe(duration, 2);
  const std::vector<PrometheusSample> samples = parse_prometheus_text(registry.render());
  ASSERT_EQ(samples.size(), 5u);
  EXPECT_EQ(samples[0].name, "demo_steps_total");
  EXPECT_EQ(samples[0].labels, (Labels{{"rank", "3"}, {"host", "node \"a\"\\b\nc"}}));
  EXPECT_EQ(samples[0].value, 5);
  EXPECT_EQ(samples[2].name, "demo_duration_seconds_bucket");
  EXPECT_EQ(*samples[2].label("le"), "+Inf");
  EXPECT_EQ(samples[2].value, 2);
  EXPECT_EQ(samples[3].value, 2.25);
  EXPECT_EQ(samples[4].value, 2);
}

TEST(PrometheusTextParser, MalformedTextIsRefusedNamingTheLine) {
  const auto error = [](const std::string& text) {
    return error_of([&] { parse_prometheus_text(text); });
  };
  EXPECT_EQ(error("ok 1\n<html><body>Not Found</body></html>\n"),
            "Prometheus text, line 2: a sample must start with a metric name: "
            "<html><body>Not Found</body></html>");
  EXPECT_EQ(error("demo_up"), "Prometheus text, line 1: a sample needs a value: demo_up");
  EXPECT_EQ(error("demo-up 1"),
            "Prometheus text, line 1: expected a space or '{' after the metric name: demo-up 1");
  EXPECT_EQ(error("# c\n\ndemo_up one"),
            "Prometheus text, line 3: 'one' is not a number: demo_up one");
  EXPECT_EQ(error("demo_up ++1"), "Prometheus text, line 1: '++1' is not a number: demo_up ++1");
  EXPECT_EQ(error("demo_up 1 12.5"),
            "Prometheus text, line 1: '12.5' is not a timestamp in milliseconds: demo_up 1 12.5");
  EXPECT_EQ(error("demo_up 1 2 3"),
            "Prometheus text, line 1: unexpected text after the sample: demo_up 1 2 3");
  EXPECT_EQ(error("demo{gpu=0} 1"),
            "Prometheus text, line 1: a label value must be in double quotes: demo{gpu=0} 1");
  EXPECT_EQ(error("demo{gpu} 1"),
            "Prometheus text, line 1: expected '=' after label name 'gpu': demo{gpu} 1");
  EXPECT_EQ(error("demo{gpu=\"0\" 1"),
            "Prometheus text, line 1: expected ',' or '}' after a label value: demo{gpu=\"0\" 1");
  EXPECT_EQ(error("demo{gpu=\"0} 1"),
            "Prometheus text, line 1: a label value's closing '\"' is missing: demo{gpu=\"0} 1");
  EXPECT_EQ(error("demo{a=\"\\t\"} 1"),
            "Prometheus text, line 1: a label value may only escape \\\\, \\\" and \\n: "
            "demo{a=\"\\t\"} 1");
  EXPECT_EQ(error("demo{a=\"1\",a=\"2\"} 1"),
            "Prometheus text, line 1: label 'a' appears twice: demo{a=\"1\",a=\"2\"} 1");
  EXPECT_EQ(error("demo{1a=\"x\"} 1"),
            "Prometheus text, line 1: expected a label name or '}': demo{1a=\"x\"} 1");
  EXPECT_EQ(error("demo{a:b=\"x\"} 1"),
            "Prometheus text, line 1: expected '=' after label name 'a': demo{a:b=\"x\"} 1");
  EXPECT_EQ(error("demo 1\r\n"), "Prometheus text, line 1: '1\r' is not a number: demo 1\r");
  EXPECT_EQ(error("demo_up " + std::string(100, '9') + "x"),
            "Prometheus text, line 1: '" + std::string(100, '9') + "x' is not a number: demo_up " +
                std::string(72, '9') + "...");
}

}  // namespace
}  // namespace kiln
