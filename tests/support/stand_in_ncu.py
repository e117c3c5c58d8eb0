#!/usr/bin/env python3
"""Stands in for Nsight Compute's `ncu` where there is no GPU, for `bench/device-check.sh --rehearse`
(its counters stage): it takes only the options that script passes, so a misspelt option or section
fails here before GPU time is spent on it, runs the profiled command (which must succeed), and
answers `--import` with placeholder kernels in ncu's CSV layout, as many as `-c` asked for (50 at
most; launches of two kernels in turn). Its numbers measure nothing.

    stand_in_ncu.py [--clock-control none] [-f] -o REPORT [--set full | --section NAME ...]
                    [-k regex:PATTERN] [-c COUNT] COMMAND...
    stand_in_ncu.py --import REPORT.ncu-rep [--csv] [--page details|raw]
"""
import argparse
import csv
import json
import re
import subprocess
import sys

# Nsight Compute's section identifiers and sets (`ncu --list-sections`, `--list-sets`) this script
# accepts: the ones device-check.sh names.
SECTIONS = {"SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats", "ComputeWorkloadAnalysis",
            "MemoryWorkloadAnalysis", "SchedulerStats", "InstructionStats", "SourceCounters"}
SETS = {"basic", "detailed", "full"}
DETAILS = ["ID", "Kernel Name", "Block Size", "Grid Size", "Section Name", "Metric Name", "Metric Unit",
           "Metric Value"]
PLACEHOLDER_METRICS = [  # section, name, unit, value
    ("GPU Speed Of Light Throughput", "Duration", "usecond", "1.00"),
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "0.00"),
    ("GPU Speed Of Light Throughput", "Memory Throughput", "%", "0.00"),
    ("GPU Speed Of Light Throughput", "DRAM Throughput", "%", "0.00"),
    ("Launch Statistics", "Registers Per Thread", "register/thread", "0"),
    ("Occupancy", "Achieved Occupancy", "%", "0.00"),
]

# Two of the raw page's warp-stall metrics (cycles stalled per issued instruction, by reason).
STALL_METRICS = ["smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
                 "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"]


def profile(argv):
    parser = argparse.ArgumentParser(prog="ncu (stand-in)")
    parser.add_argument("--clock-control", choices=["base", "none"])
    parser.add_argument("-f", "--force-overwrite", action="store_true")
    parser.add_argument("-o", "--export", required=True)
    parser.add_argument("--set", choices=sorted(SETS))
    parser.add_argument("--section", action="append", choices=sorted(SECTIONS), default=[])
    parser.add_argument("-k", "--kernel-name")
    parser.add_argument("-c", "--launch-count", type=int)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if not args.command:
        parser.error("no application to profile")
    if args.kernel_name and args.kernel_name.startswith("regex:"):
        re.compile(args.kernel_name[len("regex:"):])  # a bad pattern fails as ncu's would
    status = subprocess.run(args.command).returncode
    if status != 0:
        sys.exit(f"==ERROR== the application returned an error code ({status})")
    with open(args.export + ".ncu-rep", "w") as report:
        json.dump({"stand_in": True, "kernel_name": args.kernel_name, "command": args.command,
                   "launches": min(args.launch_count or 1, 50)}, report)


def import_report(argv):
    parser = argparse.ArgumentParser(prog="ncu --import (stand-in)")
    parser.add_argument("--import", dest="report", required=True)
    parser.add_argument("--csv", action="store_true")
    parser.add_argument("--page", choices=["details", "raw"], default="details")
    args = parser.parse_args(argv)
    with open(args.report) as report:
        launches = json.load(report)["launches"]  # a report the profile step wrote
    names = ["void stand_in_kernel<float>(int)", "void other_stand_in_kernel<float>(int)"]
    writer = csv.writer(sys.stdout, quoting=csv.QUOTE_ALL)
    if args.page == "raw":  # a header, ncu's units row, a row a launch
        writer.writerow(["ID", "Kernel Name", "gpu__time_duration.sum"] + STALL_METRICS)
        writer.writerow(["", "", "nsecond"] + [""] * len(STALL_METRICS))
        for launch in range(launches):
            writer.writerow([str(launch), names[launch % 2], "1000"] + ["0.00"] * len(STALL_METRICS))
        return
    writer.writerow(DETAILS)
    for launch in range(launches):
        for section, name, unit, value in PLACEHOLDER_METRICS:
            writer.writerow([str(launch), names[launch % 2], "(128, 1, 1)", "(1, 1, 1)", section, name, unit, value])


def main():
    if "--import" in sys.argv[1:]:
        import_report(sys.argv[1:])
    else:
        profile(sys.argv[1:])


if __name__ == "__main__":
    main()
