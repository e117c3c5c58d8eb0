#include "kiln/dist/bootstrap.h"

#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdlib>

#include "kiln/core/error.h"

namespace kiln {
namespace {

constexpr size_t kMaxHosts = size_t(1) << 20;  // an expansion bigger than any cluster is a typo

std::optional<int64_t> parse_integer(std::string_view text) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

bool all_digits(std::string_view text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
}

// One launcher's variables; every error names the source (e.g. "torchrun variables: ...").
class Variables {
 public:
  Variables(const EnvironmentLookup& environment, std::string source)
      : environment_(environment), source_(std::move(source)) {}

  const std::string& source() const { return source_; }
  std::optional<std::string> find(const std::string& name) const { return environment_(name); }
  // `name`'s value; `because` names the variable that said this source is in use.
  std::string required(const std::string& name, const std::string& because) const {
    auto value = environment_(name);
    if (!value) fail("{}: {} is set but {} is not", source_, because, name);
    return *value;
  }
  int integer(const std::string& name, const std::string& text, int minimum) const {
    const auto value = parse_integer(text);
    if (!value || *value < INT_MIN || *value > INT_MAX)
      fail("{}: {} '{}' is not an integer", source_, name, text);
    if (*value < minimum) {
      fail("{}: {} {} is {}", source_, name, *value,
           minimum == 0 ? "negative" : "below " + std::to_string(minimum));
    }
    return int(*value);
  }
  int port(const std::string& name, const std::string& text) const {
    const int port = integer(name, text, INT_MIN);
    if (port < 1 || port > 65535) fail("{}: {} {} is outside 1..65535", source_, name, port);
    return port;
  }
  std::string address(const std::string& name, const std::string& text) const {
    if (text.empty()) fail("{}: {} is empty", source_, name);
    return text;
  }

 private:
  const EnvironmentLookup& environment_;
  std::string source_;
};

struct PlaceNames {  // what each field was read from, for the consistency errors
  std::string rank, world_size, local_rank, local_world_size;
};

void check_consistent(const Variables& v, const ProcessPlace& place, const PlaceNames& names) {
  if (place.rank >= place.world_size) {
    fail("{}: {} {} is not below {} {}", v.source(), names.rank, place.rank, names.world_size,
         place.world_size);
  }
  if (place.local_rank >= place.local_world_size) {
    fail("{}: {} {} is not below {} {}", v.source(), names.local_rank, place.local_rank,
         names.local_world_size, place.local_world_size);
  }
  if (place.local_world_size > place.world_size) {
    fail("{}: {} {} is above {} {}", v.source(), names.local_world_size, place.local_world_size,
         names.world_size, place.world_size);
  }
}

ProcessPlace from_torchrun(const Variables& v) {
  const std::string because = v.find("RANK") ? "RANK" : "WORLD_SIZE";
  ProcessPlace place;
  place.source = v.source();
  place.rank = v.integer("RANK", v.required("RANK", because), 0);
  place.world_size = v.integer("WORLD_SIZE", v.required("WORLD_SIZE", because), 1);
  place.local_rank = v.integer("LOCAL_RANK", v.required("LOCAL_RANK", because), 0);
  place.local_world_size =
      v.integer("LOCAL_WORLD_SIZE", v.required("LOCAL_WORLD_SIZE", because), 1);
  place.master_addr = v.address("MASTER_ADDR", v.required("MASTER_ADDR", because));
  place.master_port = v.port("MASTER_PORT", v.required("MASTER_PORT", because));
  check_consistent(v, place, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"});
  const auto group_rank = v.find("GROUP_RANK");
  place.node_rank =
      group_rank ? v.integer("GROUP_RANK", *group_rank, 0) : place.rank / place.local_world_size;
  return place;
}

// Slurm's compressed tasks-per-node list, "2(x3),1" -> 2 2 2 1.
std::vector<int> tasks_per_node(const Variables& v, const std::string& name,
                                const std::string& text) {
  const auto bad = [&] {
    fail("{}: {} '{}' is not a tasks-per-node list like '2(x3),1'", v.source(), name, text);
  };
  std::vector<int> counts;
  std::string_view rest = text;
  while (true) {
    const std::string_view item = rest.substr(0, rest.find(','));
    const size_t open = item.find("(x");
    const std::string_view count = item.substr(0, open);
    std::string_view times = "1";
    if (open != std::string_view::npos) {
      if (item.back() != ')') bad();
      times = item.substr(open + 2, item.size() - open - 3);
    }
    if (!all_digits(count) || !all_digits(times)) bad();
    const auto n = parse_integer(count), repeat = parse_integer(times);
    if (!n || !repeat || *n < 1 || *n > INT_MAX || *repeat < 1 ||
        *repeat > int64_t(kMaxHosts - counts.size()))
      bad();
    counts.insert(counts.end(), size_t(*repeat), int(*n));
    if (item.size() == rest.size()) return counts;
    rest.remove_prefix(item.size() + 1);
  }
}

ProcessPlace from_slurm(const Variables& v) {
  const std::string because = "SLURM_PROCID";
  ProcessPlace place;
  place.source = v.source();
  place.rank = v.integer("SLURM_PROCID", v.required("SLURM_PROCID", because), 0);
  const std::string tasks =
      v.find("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  place.world_size = v.integer(tasks, v.required(tasks, because), 1);
  place.local_rank = v.integer("SLURM_LOCALID", v.required("SLURM_LOCALID", because), 0);
  place.node_rank = v.integer("SLURM_NODEID", v.required("SLURM_NODEID", because), 0);
  const std::string per_node =
      v.find("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  const std::string per_node_text = v.required(per_node, because);
  const std::vector<int> counts = tasks_per_node(v, per_node, per_node_text);
  if (size_t(place.node_rank) >= counts.size()) {
    fail("{}: {} '{}' lists {} node(s), but SLURM_NODEID is {}", v.source(), per_node,
         per_node_text, counts.size(), place.node_rank);
  }
  place.local_world_size = counts[size_t(place.node_rank)];
  check_consistent(v, place, {"SLURM_PROCID", tasks, "SLURM_LOCALID", per_node});

  if (const auto address = v.find("MASTER_ADDR")) {
    place.master_addr = v.address("MASTER_ADDR", *address);
  } else {
    const std::string nodes =
        v.find("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
    const auto list = v.find(nodes);
    if (!list)
      fail("{}: MASTER_ADDR is not set, and neither is SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST",
           v.source());
    try {
      place.master_addr = expand_hostlist(*list).front();
    } catch (const Error& e) {
      fail("{}: {}: {}", v.source(), nodes, e.what());
    }
  }
  if (const auto port = v.find("MASTER_PORT")) {
    place.master_port = v.port("MASTER_PORT", *port);
  } else {
    const auto job_id = v.find("SLURM_JOB_ID");
    if (!job_id) fail("{}: MASTER_PORT is not set, and neither is SLURM_JOB_ID", v.source());
    try {
      place.master_port = derived_master_port(*job_id);
    } catch (const Error& e) {
      fail("{}: {}", v.source(), e.what());
    }
  }
  return place;
}

// "[01-03,7]"'s inside -> 01 02 03 7.
std::vector<std::string> expand_ranges(std::string_view inside, std::string_view whole) {
  std::vector<std::string> names;
  std::string_view rest = inside;
  while (true) {
    const std::string_view item = rest.substr(0, rest.find(','));
    const size_t dash = item.find('-');
    const std::string_view first = item.substr(0, dash);
    const std::string_view last = dash == std::string_view::npos ? first : item.substr(dash + 1);
    if (item.empty()) fail("hostlist '{}' has an empty range", whole);
    if (!all_digits(first) || !all_digits(last) || first.size() > 18 || last.size() > 18) {
      fail("hostlist '{}' has a malformed range '{}'", whole, item);
    }
    const int64_t from = *parse_integer(first), to = *parse_integer(last);
    if (to < from) fail("hostlist '{}' has a range '{}' whose end is below its start", whole, item);
    if (uint64_t(to - from) >= kMaxHosts - names.size())
      fail("hostlist '{}' expands to too many names", whole);
    for (int64_t n = from; n <= to; ++n) names.push_back(fmt::format("{:0{}}", n, first.size()));
    if (item.size() == rest.size()) return names;
    rest.remove_prefix(item.size() + 1);
  }
}

// One name of a hostlist (no top-level commas), multiplied out into `hosts`.
void expand_name(std::string_view name, std::string_view whole, std::vector<std::string>& hosts) {
  if (name.empty()) fail("hostlist '{}' has an empty name", whole);
  std::vector<std::string> partial{""};
  while (!name.empty()) {
    const size_t open = name.find('[');
    std::vector<std::string> choices{std::string(name.substr(0, open))};
    if (open == 0) {
      const size_t close = name.find(']');  // the splitter has checked the brackets balance
      choices = expand_ranges(name.substr(1, close - 1), whole);
      name.remove_prefix(close + 1);
    } else {
      name.remove_prefix(open == std::string_view::npos ? name.size() : open);
    }
    if (partial.size() * choices.size() > kMaxHosts - hosts.size()) {
      fail("hostlist '{}' expands to too many names", whole);
    }
    std::vector<std::string> longer;
    for (const auto& prefix : partial) {
      for (const auto& choice : choices) longer.push_back(prefix + choice);
    }
    partial = std::move(longer);
  }
  hosts.insert(hosts.end(), partial.begin(), partial.end());
}

}  // namespace

EnvironmentLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

ProcessPlace find_process_place(const EnvironmentLookup& environment) {
  if (environment("RANK") || environment("WORLD_SIZE")) {
    return from_torchrun(Variables(environment, "torchrun variables"));
  }
  if (environment("SLURM_PROCID")) return from_slurm(Variables(environment, "Slurm variables"));
  ProcessPlace place;
  place.source = "a single process";
  return place;
}

std::vector<std::string> expand_hostlist(std::string_view hostlist) {
  if (hostlist.empty()) fail("hostlist '' is empty");
  std::vector<std::string> hosts;
  size_t start = 0;
  bool inside = false;
  for (size_t i = 0; i <= hostlist.size(); ++i) {
    const char c = i < hostlist.size() ? hostlist[i] : ',';
    if (c == '[') {
      if (inside) fail("hostlist '{}' has a '[' inside brackets", hostlist);
      inside = true;
    } else if (c == ']') {
      if (!inside) fail("hostlist '{}' has a ']' without its '['", hostlist);
      inside = false;
    } else if (c == ',' && i == hostlist.size() && inside) {
      fail("hostlist '{}' has a '[' without its ']'", hostlist);
    } else if (c == ',' && !inside) {
      expand_name(hostlist.substr(start, i - start), hostlist, hosts);
      start = i + 1;
    }
  }
  return hosts;
}

int derived_master_port(const std::string& slurm_job_id) {
  if (!all_digits(slurm_job_id))
    fail("SLURM_JOB_ID '{}' is not a non-negative integer", slurm_job_id);
  int remainder = 0;  // digit by digit, so any length of id works
  for (const char digit : slurm_job_id) remainder = (remainder * 10 + (digit - '0')) % 10000;
  return 15000 + remainder;
}

}  // namespace kiln
