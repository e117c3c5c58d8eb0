// Running the `kiln` binary (or a shell command) as a user would, for the command-line and
// distributed tests: exit code and stdout + stderr together.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kiln::testing {

struct CommandResult {
  int exit_code = -1;  // -1: did not exit normally
  std::string output;  // stdout and stderr together
};

// The kiln binary: $KILN_BINARY when set (a build moved to another machine), else the one built
// beside these tests.
inline std::string kiln_binary() {
  const char* from_environment = std::getenv("KILN_BINARY");
  return from_environment ? from_environment : KILN_BINARY;
}

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  size_t read = 0;
  while ((read = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), read);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

inline CommandResult run_kiln(const std::string& arguments) { return run_command(kiln_binary() + " " + arguments); }

}  // namespace kiln::testing
