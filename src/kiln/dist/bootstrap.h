// Where this process sits in a job, read from the launcher's environment: torchrun's variables,
// else Slurm's (srun), else a single process. Reading goes through an EnvironmentLookup so tests
// (and `kiln launch`) can supply their own variables.
//
// Every missing or malformed variable is a kiln::Error of one line naming the variable and the
// source, e.g. "torchrun variables: RANK is set but MASTER_PORT is not". Nothing here touches the
// network: the result says where rank 0's rendezvous store (store.h) will be.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

struct ProcessPlace {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string source;  // "torchrun variables", "Slurm variables", or "a single process"
  // A process a launcher placed joins a group, even one of a single rank (so `kiln launch
  // --nproc-per-node 1` runs the data-parallel path that larger jobs run); one started alone does not.
  bool joins_group() const { return source != "a single process"; }
};

// nullopt for an unset variable; "" for one set to nothing.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Reads the process environment with std::getenv, so it must not race with setenv.
EnvironmentLookup process_environment();

// torchrun's variables when RANK or WORLD_SIZE is set: RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT all required; GROUP_RANK, when set, is the node
// rank, else rank / LOCAL_WORLD_SIZE.
// Otherwise Slurm's when SLURM_PROCID is set (a task of srun): SLURM_PROCID; SLURM_STEP_NUM_TASKS
// (else SLURM_NTASKS); SLURM_LOCALID; SLURM_NODEID, the node's index within the step, which also
// picks this node's count out of SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE, Slurm's
// compressed "2(x3),1") as local_world_size; MASTER_ADDR from the environment, else the first host
// of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST); MASTER_PORT from the environment, else
// derived_master_port(SLURM_JOB_ID), so every node finds the same port without talking.
// Otherwise a single process: world 1, source "a single process".
// Checks: integers are plain decimal; 0 <= RANK < WORLD_SIZE; 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE
// <= WORLD_SIZE; MASTER_PORT in 1..65535; MASTER_ADDR not empty.
ProcessPlace find_process_place(const EnvironmentLookup& environment);

// Slurm's hostlist syntax expanded in order: "node[01-03,7],gpu-a,x[1-2]-ib" -> node01 node02
// node03 node7 gpu-a x1-ib x2-ib. Zero padding is kept as written (the width of a range's start);
// several bracket groups in one name multiply out, the leftmost varying slowest; commas outside
// brackets separate names. Malformed input (unbalanced or nested brackets, an empty name or range,
// a range whose end is below its start, more than 2^20 names) is an error naming the text.
std::vector<std::string> expand_hostlist(std::string_view hostlist);

// The same port on every node of a job, from its id: 15000 + job_id % 10000, in 15000..24999
// (clear of torchrun's default 29500 and of Linux's ephemeral range, 32768 and up). Error naming
// SLURM_JOB_ID when it is not a non-negative integer.
int derived_master_port(const std::string& slurm_job_id);

}  // namespace kiln
