// Headless Chromium for the tests that look at a page as a browser draws it: a screenshot of a
// local HTML file, and the pixels of given colours in it (png_colours.py, beside this header, with
// python3's zlib). Chromium is Debian's `chromium` (or `chromium-browser` elsewhere); a machine
// without it fails the test that needs it with a message naming scripts/install-deps.sh, which
// installs it (CI runs that script), rather than skipping where nobody would notice.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "support/kiln_process.h"

namespace kiln::testing {

// The Chromium on PATH, or "" where there is none.
inline std::string chromium_binary() {
  const CommandResult found = run_command("command -v chromium || command -v chromium-browser");
  if (found.exit_code != 0) return "";
  return found.output.substr(0, found.output.find('\n'));
}

// Renders `html_file` in a `width` x `height` window at one device pixel per CSS pixel and writes
// its PNG to `png_file`; `work_dir` holds Chromium's profile (a fresh one: no state from elsewhere).
// Bounded by 90 seconds. --no-sandbox: the tests may run as root, where the sandbox refuses to
// start; the page is the test's own.
inline CommandResult screenshot(const std::string& chromium, const std::string& html_file, const std::string& png_file,
                                int width, int height, const std::string& work_dir) {
  return run_command("timeout 90 " + chromium +
                     " --headless --disable-gpu --no-sandbox --no-first-run --hide-scrollbars"
                     " --force-device-scale-factor=1 --user-data-dir=" +
                     work_dir + "/chromium-profile" + " --window-size=" + std::to_string(width) + "," +
                     std::to_string(height) + " --screenshot=" + png_file + " file://" +
                     std::filesystem::absolute(html_file).string());
}

// The pixels of each colour ("#1f77b4") in `png_file`, exactly that colour; a failed read fails
// the calling test and gives an empty map.
inline std::map<std::string, int64_t> count_colours(const std::string& png_file,
                                                    const std::vector<std::string>& colours) {
  const std::string script = (std::filesystem::path(__FILE__).parent_path() / "png_colours.py").string();
  std::string command = "python3 " + script + " " + png_file;
  for (const std::string& colour : colours) command += " " + colour.substr(colour.starts_with('#') ? 1 : 0);
  const CommandResult counted = run_command(command);
  EXPECT_EQ(counted.exit_code, 0) << command << "\n" << counted.output;
  std::map<std::string, int64_t> counts;
  if (counted.exit_code != 0) return counts;
  std::istringstream lines(counted.output);
  std::string hex;
  for (int64_t count = 0; lines >> hex >> count;) counts["#" + hex] = count;
  return counts;
}

}  // namespace kiln::testing
