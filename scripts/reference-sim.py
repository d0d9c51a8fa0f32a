#!/usr/bin/env python3
"""A plain event-driven FCFS/EASY simulator, the yardstick `docket sim`'s speed is measured
against (README, Benchmarks). Same conventions as `docket sim` without --config: one machine
of the trace's processors; procs = requested (field 8) if positive, else allocated (field 5);
estimate = requested time (field 9) if positive, else the run time; the run time capped at
the estimate; at each instant completions, then arrivals, then one pass; EASY reserves for
the queue's head at the shadow time and backfills a job that fits now and either ends by
then or uses only the processors the head leaves spare. A job that runs 0 s ends at the
instant it starts. Prints the same figures as `docket sim` (mean wait must agree exactly).

    scripts/reference-sim.py TRACE.swf fcfs|easy [--load L] [--procs N]
"""

import heapq
import json
import sys
import time


def parse(path, procs_arg):
    jobs, max_procs, max_nodes = [], None, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            if line.startswith(";"):
                key, _, value = line[1:].partition(":")
                try:
                    if key.strip() == "MaxProcs":
                        max_procs = int(value)
                    elif key.strip() == "MaxNodes":
                        max_nodes = int(value)
                except ValueError:
                    pass
                continue
            v = line.split()
            if len(v) < 18:
                continue
            try:
                v = [int(float(x)) for x in v[:18]]
            except ValueError:
                continue
            submit, runtime = v[1], v[3]
            procs = v[7] if v[7] > 0 else v[4]
            if runtime < 0 or submit < 0 or procs <= 0:
                continue
            estimate = v[8] if v[8] > 0 else runtime
            jobs.append((submit, v[0], procs, min(runtime, estimate), estimate))
    machine = procs_arg or max_procs or max_nodes
    jobs = [j for j in jobs if j[2] <= machine]
    jobs.sort(key=lambda j: j[0])  # stable: trace order within an instant
    return jobs, machine


def at_load(jobs, machine, load):
    first, last = jobs[0][0], max(j[0] for j in jobs)
    work = sum(j[3] * j[2] for j in jobs)
    factor = (work / (max(last - first, 1) * machine)) / load
    return [(first + round((j[0] - first) * factor),) + j[1:] for j in jobs]


def simulate(jobs, machine, easy):
    free = machine
    queue = []  # waiting jobs, FCFS
    running = []  # heap of (actual end, procs, estimated end)
    starts = []
    nxt, n = 0, len(jobs)

    def start(job, t):
        nonlocal free
        free -= job[2]
        heapq.heappush(running, (t + job[3], job[2], t + job[4]))
        starts.append((job, t))

    while nxt < n or running:
        t = min(jobs[nxt][0] if nxt < n else float("inf"),
                running[0][0] if running else float("inf"))
        while running and running[0][0] == t:
            _, p, _ = heapq.heappop(running)
            free += p
        while nxt < n and jobs[nxt][0] == t:
            queue.append(jobs[nxt])
            nxt += 1
        i = 0
        while i < len(queue) and queue[i][2] <= free:
            start(queue[i], t)
            i += 1
        del queue[:i]
        if easy and queue:
            head = queue[0]
            by_end = sorted((e, p) for (_, p, e) in running)
            avail, shadow = free, None
            for e, p in by_end:
                avail += p
                if avail >= head[2]:
                    shadow = e
                    break
            extra = 0
            if shadow is not None:
                extra = free + sum(p for e, p in by_end if e <= shadow) - head[2]
            else:
                shadow = float("inf")
            k = 1
            while k < len(queue):
                j = queue[k]
                in_time = t + j[4] <= shadow
                if j[2] <= free and (in_time or j[2] <= extra):
                    if not in_time:
                        extra -= j[2]
                    start(j, t)
                    del queue[k]
                else:
                    k += 1
    return starts


def main():
    args = sys.argv[1:]
    path, policy = args[0], args[1]
    load = float(args[args.index("--load") + 1]) if "--load" in args else None
    procs = int(args[args.index("--procs") + 1]) if "--procs" in args else None
    jobs, machine = parse(path, procs)
    if load:
        jobs = at_load(jobs, machine, load)
    began = time.perf_counter()
    starts = simulate(jobs, machine, policy == "easy")
    wall = time.perf_counter() - began
    waits = sorted(t - j[0] for j, t in starts)
    bsld = [max(1.0, (t - j[0] + j[3]) / max(j[3], 10)) for j, t in starts]
    print(json.dumps({
        "policy": policy, "jobs": len(starts), "procs": machine,
        "mean_wait_s": sum(waits) / len(waits), "max_wait_s": waits[-1],
        "mean_bsld": sum(bsld) / len(bsld), "sim_wall_s": wall,
    }))


if __name__ == "__main__":
    main()
