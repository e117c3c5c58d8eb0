// How a rank whose collective failed names the ranks to blame (lost_ranks), and how rank 0 keeps
// the rendezvous store up after such a failure until the others have posted or gone
// (~ProcessGroup), each on a real store on 127.0.0.1 with the other ranks played by clients. The
// process-level tests (data_parallel_test.cpp: DataParallelFaults, DataParallelHang) reach these
// paths only through a killed or stopped rank; here each is taken alone.
#include "kiln/dist/process_group.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "kiln/dist/store.h"

namespace kiln {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

ProcessPlace place_of(int rank, int world_size, int port) {
  ProcessPlace place;
  place.rank = rank;
  place.world_size = world_size;
  place.master_port = port;
  place.source = "torchrun variables";
  return place;
}

// A rank as the store sees it: connected, with its connection registered to post gone/<rank>
// when it closes (as join_process_group registers every rank).
std::unique_ptr<StoreClient> connected_rank(int rank, int port) {
  auto client = std::make_unique<StoreClient>("127.0.0.1", port, 2s);
  client->set_when_closed("gone/" + std::to_string(rank));
  return client;
}

TEST(LostRanks, AFaultOfItsOwnNamesOnlyRanksAlreadyGoneAtOnceAndPostsNothing) {
  StoreServer server("127.0.0.1", 0);
  StoreClient watcher("127.0.0.1", server.port(), 2s);
  auto rank_1 = connected_rank(1, server.port());
  const auto rank_2 = connected_rank(2, server.port());  // stays connected and silent
  rank_1.reset();                                        // rank 1's process ended
  watcher.wait({"gone/1"}, 2000ms);

  const auto start = Clock::now();
  EXPECT_EQ(lost_ranks(place_of(0, 3, server.port()), 5s, /*peer_fault=*/false), "lost rank 1");
  EXPECT_LT(seconds_since(start), 1.0) << "waited for the silent rank 2, which a fault of its own does not blame";
  EXPECT_FALSE(watcher.check({"failed/0"})) << "posted a failure that others would take as a peer fault";
}

TEST(LostRanks, AFaultOfItsOwnWithEveryRankStillThereBlamesNone) {
  StoreServer server("127.0.0.1", 0);
  const auto rank_0 = connected_rank(0, server.port()), rank_2 = connected_rank(2, server.port());
  const auto start = Clock::now();
  EXPECT_EQ(lost_ranks(place_of(1, 3, server.port()), 5s, /*peer_fault=*/false), "");
  EXPECT_LT(seconds_since(start), 1.0);
  EXPECT_FALSE(rank_0->check({"failed/1"}));
}

TEST(LostRanks, APeerFaultPostsItsFailureAndNamesTheRanksSilentThroughTheGrace) {
  StoreServer server("127.0.0.1", 0);
  const auto rank_1 = connected_rank(1, server.port()), rank_2 = connected_rank(2, server.port());
  rank_1->set("failed/1", {});  // failed alike: not to blame
  const auto start = Clock::now();
  EXPECT_EQ(lost_ranks(place_of(0, 3, server.port()), 500ms),
            "rank 2 did not answer within 0.5 s (hung, stopped, or slower than this rank by that much)");
  EXPECT_GE(seconds_since(start), 0.5);
  EXPECT_TRUE(rank_2->check({"failed/0"}));
}

TEST(LostRanks, APeerFaultEndsTheGraceEarlyWhenEveryOtherRankFailedAlike) {
  StoreServer server("127.0.0.1", 0);
  const auto rank_1 = connected_rank(1, server.port());
  std::thread late([&] {
    std::this_thread::sleep_for(200ms);
    rank_1->set("failed/1", {});
  });
  const auto start = Clock::now();
  EXPECT_EQ(lost_ranks(place_of(0, 2, server.port()), 5s), "");
  late.join();
  EXPECT_LT(seconds_since(start), 2.0);
}

// Rank 0's group after a collective failed through a peer, as join_process_group builds it but for
// the communicator, which ~ProcessGroup destroys first anyway.
std::unique_ptr<ProcessGroup> rank_0_group(int world_size, std::chrono::milliseconds grace, bool collective_failed) {
  auto group = std::make_unique<ProcessGroup>();
  group->server = std::make_unique<StoreServer>("127.0.0.1", 0);
  group->place = place_of(0, world_size, group->server->port());
  group->store = connected_rank(0, group->server->port());
  group->failure_grace = grace;
  group->collective_failed = collective_failed;
  return group;
}

TEST(ProcessGroupLinger, RankZeroServesTheStoreAfterAPeerFaultUntilEveryRankPostedOrWent) {
  auto group = rank_0_group(3, 5s, /*collective_failed=*/true);
  const int port = group->server->port();
  auto rank_1 = connected_rank(1, port);
  auto rank_2 = connected_rank(2, port);
  bool rank_2_read_the_store = false;
  std::thread others([&] {
    std::this_thread::sleep_for(300ms);
    rank_1->set("failed/1", {});  // rank 1 explains its failure...
    std::this_thread::sleep_for(300ms);
    rank_2_read_the_store = rank_2->check({"failed/1"});  // ...rank 2 still reads the store...
    rank_2.reset();                                        // ...and ends
  });
  const auto start = Clock::now();
  group.reset();
  const double lingered = seconds_since(start);
  others.join();
  EXPECT_TRUE(rank_2_read_the_store);
  EXPECT_GE(lingered, 0.55) << "rank 0 took its store down before rank 2 had ended";
  EXPECT_LT(lingered, 4.0) << "rank 0 waited out its grace though every rank had posted or gone";
}

TEST(ProcessGroupLinger, RankZeroWaitsNoLongerThanTheGraceForSilentRanks) {
  auto group = rank_0_group(2, 600ms, /*collective_failed=*/true);
  const auto rank_1 = connected_rank(1, group->server->port());  // silent throughout
  const auto start = Clock::now();
  group.reset();
  const double lingered = seconds_since(start);
  EXPECT_GE(lingered, 0.6);
  EXPECT_LT(lingered, 3.0);
}

TEST(ProcessGroupLinger, NoLingerWithoutAPeerFault) {
  auto group = rank_0_group(2, 5s, /*collective_failed=*/false);
  const auto rank_1 = connected_rank(1, group->server->port());  // silent throughout
  const auto start = Clock::now();
  group.reset();
  EXPECT_LT(seconds_since(start), 1.0);
}

}  // namespace
}  // namespace kiln
