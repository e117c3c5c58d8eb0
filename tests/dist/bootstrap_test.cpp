#include "kiln/dist/bootstrap.h"

#include <gtest/gtest.h>

#include <map>

#include "support/error_of.h"

namespace kiln {
namespace {

using testing::error_of;
using Variables = std::map<std::string, std::string>;

EnvironmentLookup lookup(const Variables& variables) {
  return [variables](const std::string& name) -> std::optional<std::string> {
    const auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

Variables torchrun() {
  return {{"RANK", "5"},
          {"WORLD_SIZE", "8"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "4"},
          {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

// srun across 4 nodes, 2 tasks on each of the first three and 1 on the last: rank 6 is alone there.
Variables slurm() {
  return {{"SLURM_PROCID", "6"},
          {"SLURM_NTASKS", "7"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "3"},
          {"SLURM_TASKS_PER_NODE", "2(x3),1"},
          {"SLURM_JOB_NODELIST", "node[01-03,7]"},
          {"SLURM_JOB_ID", "4242"}};
}

std::string error_with(Variables variables, const Variables& changes,
                       const std::vector<std::string>& removed = {}) {
  for (const auto& [name, value] : changes) variables[name] = value;
  for (const auto& name : removed) variables.erase(name);
  return error_of([&] { find_process_place(lookup(variables)); });
}

TEST(Bootstrap, ReadsTorchrunVariables) {
  const ProcessPlace place = find_process_place(lookup(torchrun()));
  EXPECT_EQ(place.source, "torchrun variables");
  EXPECT_EQ(place.rank, 5);
  EXPECT_EQ(place.world_size, 8);
  EXPECT_EQ(place.local_rank, 1);
  EXPECT_EQ(place.local_world_size, 4);
  EXPECT_EQ(place.node_rank, 1);  // 5 / 4
  EXPECT_EQ(place.master_addr, "10.0.0.1");
  EXPECT_EQ(place.master_port, 29500);
  EXPECT_TRUE(place.joins_group());

  auto with_group = torchrun();
  with_group["GROUP_RANK"] = "3";
  EXPECT_EQ(find_process_place(lookup(with_group)).node_rank, 3);

  // A launcher's single worker still joins a group (of one), as torchrun's does.
  const ProcessPlace alone = find_process_place(lookup({{"RANK", "0"},
                                                        {"WORLD_SIZE", "1"},
                                                        {"LOCAL_RANK", "0"},
                                                        {"LOCAL_WORLD_SIZE", "1"},
                                                        {"MASTER_ADDR", "127.0.0.1"},
                                                        {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(alone.world_size, 1);
  EXPECT_TRUE(alone.joins_group());
}

TEST(Bootstrap, TorchrunWinsOverSlurm) {
  auto both = slurm();
  for (const auto& [name, value] : torchrun()) both[name] = value;
  EXPECT_EQ(find_process_place(lookup(both)).source, "torchrun variables");
}

TEST(Bootstrap, ReadsSlurmVariablesAndDerivesTheRest) {
  const ProcessPlace place = find_process_place(lookup(slurm()));
  EXPECT_EQ(place.source, "Slurm variables");
  EXPECT_EQ(place.rank, 6);
  EXPECT_EQ(place.world_size, 7);
  EXPECT_EQ(place.local_rank, 0);
  EXPECT_EQ(place.node_rank, 3);
  EXPECT_EQ(place.local_world_size, 1);  // the "1" after "2(x3)"
  EXPECT_EQ(place.master_addr, "node01");
  EXPECT_EQ(place.master_port, 15000 + 4242);

  auto second_node = slurm();
  second_node["SLURM_PROCID"] = "3";
  second_node["SLURM_LOCALID"] = "1";
  second_node["SLURM_NODEID"] = "1";
  EXPECT_EQ(find_process_place(lookup(second_node)).local_world_size, 2);
}

TEST(Bootstrap, SlurmPrefersStepVariablesAndExplicitMaster) {
  auto step = slurm();
  step["SLURM_STEP_NUM_TASKS"] = "4";
  step["SLURM_PROCID"] = "3";
  step["SLURM_NODEID"] = "1";
  step["SLURM_LOCALID"] = "1";
  step["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  step["SLURM_STEP_NODELIST"] = "gpu-a,gpu-b";
  ProcessPlace place = find_process_place(lookup(step));
  EXPECT_EQ(place.world_size, 4);
  EXPECT_EQ(place.local_world_size, 2);
  EXPECT_EQ(place.master_addr, "gpu-a");

  step["MASTER_ADDR"] = "10.1.2.3";
  step["MASTER_PORT"] = "23456";
  place = find_process_place(lookup(step));
  EXPECT_EQ(place.master_addr, "10.1.2.3");
  EXPECT_EQ(place.master_port, 23456);
}

TEST(Bootstrap, NoLauncherIsASingleProcess) {
  const ProcessPlace place = find_process_place(lookup({{"HOME", "/root"}, {"MASTER_PORT", "x"}}));
  EXPECT_EQ(place.source, "a single process");
  EXPECT_EQ(place.world_size, 1);
  EXPECT_EQ(place.rank, 0);
  EXPECT_FALSE(place.joins_group());
}

TEST(Bootstrap, TorchrunErrorsNameTheVariable) {
  EXPECT_EQ(error_with(torchrun(), {}, {"MASTER_PORT"}),
            "torchrun variables: RANK is set but MASTER_PORT is not");
  EXPECT_EQ(error_with(torchrun(), {}, {"RANK"}),
            "torchrun variables: WORLD_SIZE is set but RANK is not");
  EXPECT_EQ(error_with(torchrun(), {{"RANK", "4x"}}),
            "torchrun variables: RANK '4x' is not an integer");
  EXPECT_EQ(error_with(torchrun(), {{"RANK", "8"}}),
            "torchrun variables: RANK 8 is not below WORLD_SIZE 8");
  EXPECT_EQ(error_with(torchrun(), {{"RANK", "-1"}}), "torchrun variables: RANK -1 is negative");
  EXPECT_EQ(error_with(torchrun(), {{"WORLD_SIZE", "0"}}),
            "torchrun variables: WORLD_SIZE 0 is below 1");
  EXPECT_EQ(error_with(torchrun(), {{"LOCAL_RANK", "4"}}),
            "torchrun variables: LOCAL_RANK 4 is not below LOCAL_WORLD_SIZE 4");
  EXPECT_EQ(error_with(torchrun(), {{"LOCAL_WORLD_SIZE", "16"}}),
            "torchrun variables: LOCAL_WORLD_SIZE 16 is above WORLD_SIZE 8");
  EXPECT_EQ(error_with(torchrun(), {{"MASTER_PORT", "70000"}}),
            "torchrun variables: MASTER_PORT 70000 is outside 1..65535");
  EXPECT_EQ(error_with(torchrun(), {{"MASTER_PORT", "0"}}),
            "torchrun variables: MASTER_PORT 0 is outside 1..65535");
  EXPECT_EQ(error_with(torchrun(), {{"MASTER_ADDR", ""}}),
            "torchrun variables: MASTER_ADDR is empty");
  EXPECT_EQ(error_with(torchrun(), {{"GROUP_RANK", "a"}}),
            "torchrun variables: GROUP_RANK 'a' is not an integer");
}

TEST(Bootstrap, SlurmErrorsNameTheVariable) {
  EXPECT_EQ(error_with(slurm(), {{"SLURM_PROCID", "x"}}),
            "Slurm variables: SLURM_PROCID 'x' is not an integer");
  EXPECT_EQ(error_with(slurm(), {}, {"SLURM_NTASKS"}),
            "Slurm variables: SLURM_PROCID is set but SLURM_NTASKS is not");
  EXPECT_EQ(error_with(slurm(), {}, {"SLURM_LOCALID"}),
            "Slurm variables: SLURM_PROCID is set but SLURM_LOCALID is not");
  EXPECT_EQ(error_with(slurm(), {{"SLURM_PROCID", "7"}}),
            "Slurm variables: SLURM_PROCID 7 is not below SLURM_NTASKS 7");
  EXPECT_EQ(error_with(slurm(), {{"SLURM_LOCALID", "1"}}),
            "Slurm variables: SLURM_LOCALID 1 is not below SLURM_TASKS_PER_NODE 1");
  EXPECT_EQ(
      error_with(slurm(), {{"SLURM_NODEID", "4"}}),
      "Slurm variables: SLURM_TASKS_PER_NODE '2(x3),1' lists 4 node(s), but SLURM_NODEID is 4");
  EXPECT_EQ(
      error_with(slurm(), {{"SLURM_TASKS_PER_NODE", "2(x3"}}),
      "Slurm variables: SLURM_TASKS_PER_NODE '2(x3' is not a tasks-per-node list like '2(x3),1'");
  EXPECT_EQ(error_with(slurm(), {{"SLURM_JOB_NODELIST", "node[01-03"}}),
            "Slurm variables: SLURM_JOB_NODELIST: hostlist 'node[01-03' has a '[' without its ']'");
  EXPECT_EQ(error_with(slurm(), {}, {"SLURM_JOB_NODELIST"}),
            "Slurm variables: MASTER_ADDR is not set, and neither is SLURM_STEP_NODELIST nor "
            "SLURM_JOB_NODELIST");
  EXPECT_EQ(error_with(slurm(), {{"SLURM_JOB_ID", "12a"}}),
            "Slurm variables: SLURM_JOB_ID '12a' is not a non-negative integer");
  EXPECT_EQ(error_with(slurm(), {}, {"SLURM_JOB_ID"}),
            "Slurm variables: MASTER_PORT is not set, and neither is SLURM_JOB_ID");
  EXPECT_EQ(error_with(slurm(), {{"MASTER_PORT", "65536"}}),
            "Slurm variables: MASTER_PORT 65536 is outside 1..65535");
}

TEST(Hostlist, ExpandsRangesInOrderKeepingPadding) {
  EXPECT_EQ(
      expand_hostlist("node[01-03,7],gpu-a,x[1-2]-ib"),
      (std::vector<std::string>{"node01", "node02", "node03", "node7", "gpu-a", "x1-ib", "x2-ib"}));
  EXPECT_EQ(expand_hostlist("solo"), (std::vector<std::string>{"solo"}));
  EXPECT_EQ(expand_hostlist("n[8-10]"), (std::vector<std::string>{"n8", "n9", "n10"}));
  EXPECT_EQ(expand_hostlist("n[098-100]"), (std::vector<std::string>{"n098", "n099", "n100"}));
  EXPECT_EQ(expand_hostlist("rack[1-2]n[0-1]"),
            (std::vector<std::string>{"rack1n0", "rack1n1", "rack2n0", "rack2n1"}));
  EXPECT_EQ(expand_hostlist("[3-4]x"), (std::vector<std::string>{"3x", "4x"}));
}

TEST(Hostlist, MalformedListsAreErrorsNamingTheText) {
  EXPECT_EQ(error_of([] { expand_hostlist(""); }), "hostlist '' is empty");
  EXPECT_EQ(error_of([] { expand_hostlist("n[1-2"); }),
            "hostlist 'n[1-2' has a '[' without its ']'");
  EXPECT_EQ(error_of([] { expand_hostlist("n1-2]"); }),
            "hostlist 'n1-2]' has a ']' without its '['");
  EXPECT_EQ(error_of([] { expand_hostlist("n[1-[2]]"); }),
            "hostlist 'n[1-[2]]' has a '[' inside brackets");
  EXPECT_EQ(error_of([] { expand_hostlist("n[5-3]"); }),
            "hostlist 'n[5-3]' has a range '5-3' whose end is below its start");
  EXPECT_EQ(error_of([] { expand_hostlist("n[]"); }), "hostlist 'n[]' has an empty range");
  EXPECT_EQ(error_of([] { expand_hostlist("n[1-a]"); }),
            "hostlist 'n[1-a]' has a malformed range '1-a'");
  EXPECT_EQ(error_of([] { expand_hostlist("a,,b"); }), "hostlist 'a,,b' has an empty name");
  EXPECT_EQ(error_of([] { expand_hostlist("n[0-99999999]"); }),
            "hostlist 'n[0-99999999]' expands to too many names");
  EXPECT_EQ(error_of([] { expand_hostlist("a[0-9999]b[0-999]"); }),
            "hostlist 'a[0-9999]b[0-999]' expands to too many names");
}

TEST(DerivedMasterPort, IsStableAndInRange) {
  EXPECT_EQ(derived_master_port("4242"), 19242);
  EXPECT_EQ(derived_master_port("0"), 15000);
  EXPECT_EQ(derived_master_port("1234567"), 19567);
  EXPECT_EQ(derived_master_port("123456789012345678901234567890"),
            15000 + 7890);  // longer than int64
  EXPECT_EQ(derived_master_port("1234567"), derived_master_port("1234567"));
  for (const char* id : {"9999", "10000", "29500", "87654321"}) {
    const int port = derived_master_port(id);
    EXPECT_GE(port, 15000);
    EXPECT_LE(port, 24999);
  }
  EXPECT_EQ(error_of([] { derived_master_port("-3"); }),
            "SLURM_JOB_ID '-3' is not a non-negative integer");
  EXPECT_EQ(error_of([] { derived_master_port(""); }),
            "SLURM_JOB_ID '' is not a non-negative integer");
}

}  // namespace
}  // namespace kiln
