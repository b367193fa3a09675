#!/usr/bin/env python3
"""Runs a command and samples the resident memory of its whole process tree (the command and every process it
starts: datasets.map's workers too) every 50 ms; prints `peak_tree_rss_mib=N wall_s=S` on stderr at the end and
exits with the command's status.

  tree_rss.py COMMAND [ARG...]
"""
import subprocess
import sys
import time

import psutil

start = time.perf_counter()
child = subprocess.Popen(sys.argv[1:])
root = psutil.Process(child.pid)
peak = 0
while child.poll() is None:
    try:
        total = root.memory_info().rss + sum(p.memory_info().rss for p in root.children(recursive=True))
        peak = max(peak, total)
    except psutil.Error:  # a process ended while it was read
        pass
    time.sleep(0.05)
print(f"peak_tree_rss_mib={peak / 2**20:.0f} wall_s={time.perf_counter() - start:.1f}", file=sys.stderr)
sys.exit(child.returncode)
