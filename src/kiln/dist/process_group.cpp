#include "kiln/dist/process_group.h"

#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <vector>

#include "kiln/core/error.h"

namespace kiln {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

// "" when equal; else which key differs, with both values.
std::string first_difference(const std::string& mine, const std::string& theirs, int their_rank) {
  const std::vector<std::string> a = lines_of(mine), b = lines_of(theirs);
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string line_a = i < a.size() ? a[i] : "", line_b = i < b.size() ? b[i] : "";
    if (line_a == line_b) continue;
    const auto key_of = [](const std::string& line) { return line.substr(0, line.find(':')); };
    const auto value_of = [](const std::string& line) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + (colon + 1 < line.size() ? 2 : 1));
    };
    const std::string key = key_of(line_a.empty() ? line_b : line_a);
    return fmt::format("rank {} was started with another configuration than rank 0: {} is '{}' there and '{}' on "
                       "rank 0",
                       their_rank, key, value_of(line_b), value_of(line_a));
  }
  return {};
}

std::vector<char> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

}  // namespace

void check_same_configuration(StoreClient& store, int rank, int world_size, const std::string& config_yaml) {
  store.set("config/" + std::to_string(rank), bytes_of(config_yaml));
  if (rank == 0) {
    std::string verdict;
    for (int other = 1; other < world_size && verdict.empty(); ++other) {
      const std::vector<char> theirs = store.get("config/" + std::to_string(other));
      verdict = first_difference(config_yaml, std::string(theirs.begin(), theirs.end()), other);
    }
    store.set("config/verdict", bytes_of(verdict));
  }
  const std::vector<char> verdict = store.get("config/verdict");
  KILN_CHECK(verdict.empty(), "{}", std::string(verdict.begin(), verdict.end()));
}

GlooCommunicator::Address gloo_address(const ProcessPlace& place, const EnvironmentLookup& environment) {
  if (const auto iface = environment("GLOO_SOCKET_IFNAME"); iface && !iface->empty()) return {"", *iface};
  if (place.master_addr == "localhost" || place.master_addr.starts_with("127.")) return {"127.0.0.1", ""};
  char name[256] = {};
  KILN_CHECK(::gethostname(name, sizeof(name) - 1) == 0, "cannot read this host's name for gloo");
  return {name, ""};
}

std::unique_ptr<ProcessGroup> join_process_group(const ProcessPlace& place, const std::string& backend,
                                                 std::chrono::milliseconds timeout, const std::string& config_yaml) {
  auto group = std::make_unique<ProcessGroup>();
  group->place = place;
  if (place.rank == 0) group->server = std::make_unique<StoreServer>("", place.master_port);
  group->store = std::make_unique<StoreClient>(place.master_addr, place.master_port, timeout);
  check_same_configuration(*group->store, place.rank, place.world_size, config_yaml);
  if (backend == "gloo") {
    group->communicator = std::make_unique<GlooCommunicator>(
        place.rank, place.world_size, *group->store, gloo_address(place, process_environment()), timeout);
  } else {
    fail("distributed backend '{}': this build of kiln has no NCCL communicator yet; GPU ranks cannot train "
         "together (CPU ranks can: --device cpu --distributed-backend gloo)",
         backend);
  }
  return group;
}

}  // namespace kiln
