#include "kiln/dist/process_group.h"

#include <unistd.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/ranges.h>

#include "kiln/core/error.h"
#ifdef KILN_WITH_CUDA
#include "kiln/dist/nccl/nccl_communicator.h"
#endif

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

std::string gone_key(int rank) { return "gone/" + std::to_string(rank); }
std::string failed_key(int rank) { return "failed/" + std::to_string(rank); }

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("rank{} {}", ranks.size() > 1 ? "s" : "", fmt::join(ranks, ", "));
}

}  // namespace

std::string lost_ranks(const ProcessPlace& place, std::chrono::milliseconds grace, bool peer_fault) {
  using namespace std::chrono;
  const auto start = steady_clock::now();
  std::set<int> unknown;  // neither failed alike nor gone, as far as this rank has heard
  for (int rank = 0; rank < place.world_size; ++rank)
    if (rank != place.rank) unknown.insert(rank);
  std::vector<int> gone;
  bool rank_0_failed_alike = false;
  try {
    StoreClient probe(place.master_addr, place.master_port, 2s);
    if (peer_fault) probe.set(failed_key(place.rank), {});
    // A dead rank's connection closes at once, but the store may learn it a moment after the engine
    // did; a hung rank's only sign is that it never posts. Scanning only the ranks not yet heard
    // from keeps the store's load small for large jobs; each is taken out as soon as it is heard
    // from, so a store that goes away mid-scan leaves the set right.
    for (;;) {
      for (auto rank = unknown.begin(); rank != unknown.end();) {
        if (probe.check({failed_key(*rank)})) {  // failed alike: not to blame, even if it has ended since
          rank_0_failed_alike |= *rank == 0;
        } else if (probe.check({gone_key(*rank)})) {
          gone.push_back(*rank);
        } else {
          ++rank;
          continue;
        }
        rank = unknown.erase(rank);
      }
      if (!peer_fault || !gone.empty() || unknown.empty() || steady_clock::now() - start >= grace) break;
      std::this_thread::sleep_for(100ms);
    }
  } catch (const Error&) {
    // Rank 0 ended after failing alike (its store went with it): the ranks not heard from until then
    // are the ones to blame. Otherwise rank 0 itself is gone, hung or stopped.
    if (!rank_0_failed_alike) return "lost rank 0 (the rendezvous store it served is gone or does not answer)";
  } catch (const std::exception&) {
    return {};  // no answer, rather than a second failure in the middle of reporting the first
  }
  if (!gone.empty()) return "lost " + rank_list(gone);
  if (unknown.empty() || !peer_fault) return {};
  // Cut short only by rank 0 ending after its own full grace, through which it heard nothing either.
  return fmt::format("{} did not answer within {:g} s (hung, stopped, or slower than this rank by that much)",
                     rank_list({unknown.begin(), unknown.end()}), duration<double>(grace).count());
}

ProcessGroup::~ProcessGroup() {
  communicator.reset();  // first: its thread may be explaining a failure through the store
  if (!server || !collective_failed) return;
  const auto deadline = std::chrono::steady_clock::now() + failure_grace;
  try {
    for (int rank = 1; rank < place.world_size; ++rank)
      while (!store->check({failed_key(rank)}) && !store->check({gone_key(rank)}) &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } catch (const std::exception&) {
    // Destroying: nothing more to serve.
  }
}

std::chrono::milliseconds lost_rank_grace(std::chrono::milliseconds timeout) {
  using namespace std::chrono_literals;
  return std::clamp<std::chrono::milliseconds>(timeout, 2s, 10s);
}

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
  group->store->set_when_closed(gone_key(place.rank));
  check_same_configuration(*group->store, place.rank, place.world_size, config_yaml);
  group->failure_grace = lost_rank_grace(timeout);
  // The communicator is destroyed first (~ProcessGroup), so the group outlives every call.
  const FailureExplainer explain = [group = group.get()](bool peer_fault) {
    if (peer_fault) group->collective_failed = true;  // a fault of its own: the others find it gone
    return lost_ranks(group->place, group->failure_grace, peer_fault);
  };
  if (backend == "gloo") {
    group->communicator =
        std::make_unique<GlooCommunicator>(place.rank, place.world_size, *group->store,
                                           gloo_address(place, process_environment()), timeout, explain);
  } else if (backend == "nccl") {
#ifdef KILN_WITH_CUDA
    group->communicator = make_nccl_communicator(place.rank, place.world_size, place.local_rank, *group->store,
                                                 timeout, explain);
#else
    fail("distributed backend 'nccl': this kiln was built without CUDA (nvcc was not found at configure time); "
         "CPU ranks use --device cpu --distributed-backend gloo");
#endif
  } else {
    fail("distributed backend '{}' is not nccl or gloo", backend);
  }
  return group;
}

}  // namespace kiln
