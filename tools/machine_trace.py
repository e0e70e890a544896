#!/usr/bin/env python3
"""Machine-wide trace for benchmark runs on a (virtual) machine: what the kernel says about CPU and memory.

Samples /proc every INTERVAL seconds and writes one TSV row per sample: CPU time split (user, system, idle, iowait,
steal: time the hypervisor ran something else on our virtual CPUs), page faults (minor, major), memory
(MemTotal, MemAvailable: on a VM whose memory grows as it is used, MemTotal changes), and pressure-stall
information where the kernel has it. `--summary FILE` reads such a trace and prints the intervals in which
steal, faults or CPU pressure were high, so a benchmark's stalls can be matched against them.

    python3 tools/machine_trace.py --output trace.tsv --interval 0.25 &   # until SIGTERM/SIGINT
    python3 tools/machine_trace.py --summary trace.tsv
    python3 tools/machine_trace.py --memory-probe 1024      # fresh-page and reused-page write rates, GiB/s
    python3 tools/machine_trace.py --watch-pid PID --output threads.txt   # busy threads + native stacks
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

COLUMNS = ("t_s", "user_s", "system_s", "idle_s", "iowait_s", "steal_s", "minflt", "majflt", "mem_total_mib",
           "mem_available_mib", "cpu_some_avg10", "memory_some_avg10")


def cpu_seconds() -> dict[str, float]:
    """Machine-wide CPU seconds since boot (/proc/stat): user, system, idle, iowait, steal (time the hypervisor
    ran something else while our virtual CPUs wanted to run)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    hz = 100.0     # USER_HZ; /proc/stat counts in it on every Linux
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    values = dict(zip(names, (int(v) / hz for v in fields)))
    return {"user": values["user"] + values["nice"], "system": values["system"] + values["irq"] + values["softirq"],
            "idle": values["idle"], "iowait": values["iowait"], "steal": values.get("steal", 0.0)}


def _vmstat() -> dict[str, int]:
    out = {}
    for line in Path("/proc/vmstat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key in ("pgfault", "pgmajfault"):
            out[key] = int(value)
    return out


def _meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            out[key] = int(rest.split()[0]) // 1024
    return out


def _pressure(resource: str) -> str:
    try:
        first = Path(f"/proc/pressure/{resource}").read_text().splitlines()[0]    # "some avg10=.. avg60=.."
        return first.split()[1].split("=")[1]
    except (OSError, IndexError):
        return ""


def sample(t0: float) -> list[str]:
    cpu, vm, mem = cpu_seconds(), _vmstat(), _meminfo()
    return [f"{time.monotonic() - t0:.3f}", f"{cpu['user']:.2f}", f"{cpu['system']:.2f}", f"{cpu['idle']:.2f}",
            f"{cpu['iowait']:.2f}", f"{cpu['steal']:.2f}", str(vm.get("pgfault", 0)), str(vm.get("pgmajfault", 0)),
            str(mem.get("MemTotal", 0)), str(mem.get("MemAvailable", 0)), _pressure("cpu"), _pressure("memory")]


def _thread_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (name, user + system CPU seconds) of every thread of a process."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / 100.0)   # utime, stime
    return out


def watch_threads(pid: int, output: Path, interval: float, busy: float, backtraces: int) -> int:
    """Per-thread CPU of PID every INTERVAL; when one thread burns more than BUSY of a CPU over an interval, logs
    it, and when the same thread does so for two intervals in a row, (up to BACKTRACES times) attaches a debugger for the native stacks of all threads (cuda-gdb or gdb,
    whichever exists; the process stops while it is attached)."""
    import shutil
    import subprocess

    debugger = shutil.which("gdb") or shutil.which("cuda-gdb")
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__(0, True))
    t0, last, streak, hot_tid = time.monotonic(), {}, 0, None
    last_t = t0
    with output.open("w") as f:
        f.write(f"watching pid {pid}; debugger {debugger}\n")
        while not stop[0] and Path(f"/proc/{pid}").exists():
            now = time.monotonic()
            try:
                threads = _thread_cpu_s(pid)
            except OSError:
                break
            if last:
                rates = sorted(((cpu - last[tid][1]) / (now - last_t), tid, name) for tid, (name, cpu)
                               in threads.items() if tid in last)
                total = sum(r for r, _, _ in rates)
                hot = rates[-1][2] if rates and rates[-1][0] > busy else None
                if hot is not None:
                    rate, tid, name = rates[-1]
                    streak = streak + 1 if tid == hot_tid else 1
                    hot_tid = tid
                else:
                    streak, hot_tid = 0, None
                if hot is not None:
                    f.write(f"{now - t0:.2f} s: thread {tid} ({name}) {rate:.2f} CPU; process {total:.2f} CPU; "
                            f"next {[(round(r, 2), t, n) for r, t, n in rates[-4:-1]]}\n")
                    if backtraces > 0 and debugger and streak >= 2:      # one thread busy for 2 intervals
                        backtraces -= 1
                        dump = subprocess.run([debugger, "-p", str(pid), "-batch", "-ex", "info threads",
                                               "-ex", "thread apply all bt 30"], capture_output=True, text=True,
                                              timeout=120)
                        f.write(f"--- native stacks (busy thread {tid}) ---\n{dump.stdout[-60000:]}\n"
                                f"{dump.stderr[-2000:]}\n--- end ---\n")
                        threads, now = _thread_cpu_s(pid), time.monotonic()
                f.flush()
            last, last_t = threads, now
            time.sleep(interval)
    return 0


def record(output: Path, interval: float) -> int:
    stop = [False]

    def halt(*_):
        stop[0] = True

    signal.signal(signal.SIGTERM, halt)
    signal.signal(signal.SIGINT, halt)
    t0 = time.monotonic()
    with output.open("w") as f:
        f.write("\t".join(COLUMNS) + "\n")
        while not stop[0]:
            f.write("\t".join(sample(t0)) + "\n")
            f.flush()
            time.sleep(interval)
    return 0


def summarize(path: Path, top: int = 15) -> str:
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:] if line.strip()]
    if len(rows) < 2:
        return f"{path}: fewer than 2 samples"
    num = [[float(v) if v else 0.0 for v in row] for row in rows]
    deltas = []
    for a, b in zip(num, num[1:]):
        dt = b[0] - a[0]
        busy = sum(b[i] - a[i] for i in (1, 2, 3, 4, 5))
        deltas.append({"t_s": b[0], "dt": dt, "steal_frac": (b[5] - a[5]) / busy if busy > 0 else 0.0,
                       "user_cpus": (b[1] - a[1]) / dt, "system_cpus": (b[2] - a[2]) / dt,
                       "faults_per_s": (b[6] - a[6]) / dt, "majfaults": b[7] - a[7],
                       "mem_total_mib": b[8], "mem_available_mib": b[9], "cpu_some_avg10": b[10]})
    total_steal = sum(b[5] - a[5] for a, b in zip(num, num[1:]))
    total_cpu = sum(sum(b[i] - a[i] for i in (1, 2, 3, 4, 5)) for a, b in zip(num, num[1:]))
    lines = [f"{len(rows)} samples over {num[-1][0] - num[0][0]:.1f} s; steal {100 * total_steal / max(total_cpu, 1e-9):.2f}% "
             f"of all CPU time; MemTotal {num[0][8]:.0f} -> {num[-1][8]:.0f} MiB; faults "
             f"{num[-1][6] - num[0][6]:.0f} minor, {num[-1][7] - num[0][7]:.0f} major; max cpu pressure avg10 "
             f"{max(r[10] for r in num):.2f}",
             "worst intervals by steal, then faults:",
             "| t [s] | steal | user CPUs | system CPUs | faults/s | MemTotal MiB | MemAvailable MiB |",
             "|---|---|---|---|---|---|---|"]
    for d in sorted(deltas, key=lambda d: (d["steal_frac"], d["faults_per_s"]), reverse=True)[:top]:
        lines.append(f"| {d['t_s']:.2f} | {100 * d['steal_frac']:.1f}% | {d['user_cpus']:.2f} | {d['system_cpus']:.2f} "
                     f"| {d['faults_per_s']:.0f} | {d['mem_total_mib']:.0f} | {d['mem_available_mib']:.0f} |")
    return "\n".join(lines)


def memory_probe(mib: int, rounds: int = 4) -> str:
    """Writes MIB of freshly mapped memory, frees it, and repeats; then rewrites one kept buffer. Fresh pages cost
    a page fault each (and, on a VM that hands memory back to its host, a trip to the host); reused pages do not."""
    import numpy as np

    lines = []
    for i in range(rounds):
        t0 = time.perf_counter()
        buf = np.ones(mib * 1024 * 1024, dtype=np.uint8)     # calloc'ed pages touched by the fill
        dt = time.perf_counter() - t0
        lines.append(f"fresh pages, round {i}: {mib / 1024 / dt:.2f} GiB/s ({dt * 1e3:.1f} ms for {mib} MiB)")
        del buf
    keep = np.empty(mib * 1024 * 1024, dtype=np.uint8)
    keep.fill(1)
    for i in range(rounds):
        t0 = time.perf_counter()
        keep.fill(i + 2)
        dt = time.perf_counter() - t0
        lines.append(f"reused pages, round {i}: {mib / 1024 / dt:.2f} GiB/s ({dt * 1e3:.1f} ms)")
    small = []
    for _ in range(200):   # the node's per-frame size: one 640x480 rgb8 image
        t0 = time.perf_counter()
        frame = np.ones(640 * 480 * 3, dtype=np.uint8)
        small.append(time.perf_counter() - t0)
        del frame
    small.sort()
    lines.append(f"921,600-byte fresh array x200: median {small[100] * 1e6:.0f} us, max {small[-1] * 1e6:.0f} us")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, help="record a trace into this TSV file until SIGTERM/SIGINT")
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--summary", type=Path, help="summarize a recorded trace")
    parser.add_argument("--memory-probe", type=int, metavar="MIB", help="time writes to fresh and reused memory")
    parser.add_argument("--watch-pid", type=int, help="with --output: log the threads of this process that "
                        "burn a CPU, with native stacks (see --backtraces)")
    parser.add_argument("--busy", type=float, default=0.8, help="--watch-pid: CPU share that counts as busy")
    parser.add_argument("--backtraces", type=int, default=2, help="--watch-pid: debugger dumps at most")
    args = parser.parse_args(argv)
    if args.output and args.watch_pid:
        return watch_threads(args.watch_pid, args.output, args.interval, args.busy, args.backtraces)
    if args.output:
        return record(args.output, args.interval)
    if args.summary:
        print(summarize(args.summary))
        return 0
    if args.memory_probe:
        print(memory_probe(args.memory_probe))
        return 0
    parser.error("one of --output, --summary, --memory-probe")
    return 2


if __name__ == "__main__":
    sys.exit(main())
