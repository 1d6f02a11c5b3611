"""The measuring harness the benchmarks share: machine record, interleaved timing, tables, JSON.

Not part of the package and never imported by it. Every benchmark in this directory
runs alone (``python benchmarks/X.py``); this module is found next to it on ``sys.path``.

Rules it enforces, because the machines it runs on are shared and noisy:

* competitors are measured in the same process, interleaved: each round runs every
  method once, in an order that rotates from round to round;
* each method is repeated (5 or more timed rounds after a warm-up round) and reported as
  min / median / max; ratios are taken between medians of the same run;
* the garbage collector is off while a method is timed.
"""

from __future__ import annotations

import gc
import importlib.metadata
import json
import os
import platform
import resource
import shlex
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import compactstore  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results"

#: Rounds per ``--repeat`` for rows whose rounds are short (a few batches or a hundred
#: commits, well under a second): one slow fsync of this shared disk moves such a
#: round by half, so their medians take this many times more rounds, at little cost.
SHORT_ROUNDS = 5

#: Distributions whose versions are recorded with every result, when installed.
PACKAGES = (
    "compactstore",
    "blake3",
    "msgspec",
    "psycopg",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint",
    "openai-agents",
    "eventsourcing",
    "matplotlib",
)

Row = tuple[str, ...]
#: A method to time: returns None (the harness times the whole call) or the seconds it
#: measured itself (when the call has set-up that must not be timed).
Method = Callable[[], "float | None"]


def cpu_model() -> str:
    """Return the CPU model name from /proc/cpuinfo, or what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("model name", "Hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_flags() -> list[str]:
    """Return the SIMD and hash flags of the CPU that matter for hashing (avx2, avx512f, sha_ni)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [f for f in ("sse4_1", "avx2", "avx512f", "sha_ni") if f in have]
    except OSError:
        pass
    return []


def versions() -> dict[str, str]:
    """Return the installed version of each distribution in PACKAGES."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def revision() -> str:
    """Return the checkout's commit, with ``+dirty`` when files of the package differ from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "compactstore"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    """Return what a result needs to be reproduced: command, machine, interpreter, packages."""
    return {
        "revision": revision(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "platform": f"{platform.platform()}, {platform.machine()}",
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "sqlite": sqlite3.sqlite_version,
        "packages": versions(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def print_machine(info: dict[str, Any], repeat: int | None = None) -> None:
    """Print the command and machine lines every benchmark starts with."""
    print(f"command:  {info['command']}")
    print(f"machine:  {info['platform']}")
    flags = f", {' '.join(info['cpu_flags'])}" if info["cpu_flags"] else ""
    print(f"cpu:      {info['cpu']} ({info['logical_cpus']} logical CPUs{flags})")
    print(f"python:   {info['python']}, SQLite {info['sqlite']}")
    print("packages: " + ", ".join(f"{k} {v}" for k, v in info["packages"].items())
          + f" (checkout {info['revision']})")
    if repeat is not None:
        print(f"repeat:   {repeat} timed rounds per row after one warm-up round, methods interleaved; "
              "ratios between medians of the same run")


def _call(fn: Method) -> float:
    t0 = time.perf_counter()
    got = fn()
    elapsed = time.perf_counter() - t0
    return float(got) if isinstance(got, (int, float)) and not isinstance(got, bool) else elapsed


def interleaved(methods: Sequence[tuple[str, Method]], repeat: int, warmup: int = 1) -> dict[str, list[float]]:
    """Time every method ``repeat`` times, one of each per round, rotating the order per round.

    Returns each method's timed durations in seconds (warm-up rounds dropped). A method
    that returns a float has timed itself and that float is taken instead.
    """
    out: dict[str, list[float]] = {name: [] for name, _ in methods}
    n = len(methods)
    for r in range(warmup + repeat):
        order = [methods[(r + i) % n] for i in range(n)]
        for name, fn in order:
            gc.collect()
            was = gc.isenabled()
            gc.disable()
            try:
                elapsed = _call(fn)
            finally:
                if was:
                    gc.enable()
            if r >= warmup:
                out[name].append(elapsed)
    return out


def timings(fn: Method, repeat: int, warmup: int = 1) -> list[float]:
    """Return ``repeat`` durations of ``fn()`` after ``warmup`` untimed calls (one method alone)."""
    return interleaved([("fn", fn)], repeat, warmup)["fn"]


@dataclass(frozen=True)
class Stat:
    """Min, median and max of repeated durations (seconds), and how many there were."""

    min: float
    median: float
    max: float
    n: int

    @classmethod
    def of(cls, ts: Sequence[float]) -> Stat:
        """Summarise durations ``ts``."""
        return cls(min(ts), statistics.median(ts), max(ts), len(ts))

    def as_dict(self) -> dict[str, float]:
        """Return the stat as plain JSON numbers."""
        return {"min": self.min, "median": self.median, "max": self.max, "n": self.n}


def seconds(x: float) -> str:
    """Format a duration with a unit that keeps three significant digits."""
    if x >= 1:
        return f"{x:.3f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.3g} ms"
    return f"{x * 1e6:.3g} us"


def rate(x: float) -> str:
    """Format a per-second rate with a thousands separator."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def ratio(x: float) -> str:
    """Format a ratio as ``0.23x``."""
    return f"{x:.3g}x" if x < 100 else f"{x:,.0f}x"


@dataclass
class Goal:
    """One goal check: ``value`` (ours / reference) against ``target``."""

    name: str
    value: float
    target: float
    higher_is_better: bool = True
    note: str = ""

    @property
    def met(self) -> bool:
        """Return whether the value meets the target."""
        return self.value >= self.target if self.higher_is_better else self.value <= self.target

    def line(self) -> str:
        """Return the goal as one printed line, with how far it is missed."""
        op = ">=" if self.higher_is_better else "<="
        if self.met:
            verdict = "met"
        elif self.higher_is_better:
            verdict = f"MISSED: {self.target / self.value:.3g}x short" if self.value > 0 else "MISSED"
        else:
            verdict = f"MISSED: {self.value / self.target:.3g}x over" if self.target else "MISSED"
        note = f" ({self.note})" if self.note else ""
        return f"{self.name}: {self.value:.3g} (target {op} {self.target:g}) {verdict}{note}"

    def as_dict(self) -> dict[str, Any]:
        """Return the goal as JSON."""
        return {"name": self.name, "value": self.value, "target": self.target,
                "higher_is_better": self.higher_is_better, "met": self.met, "note": self.note}


@dataclass
class Section:
    """One printed table and what goes to JSON with it."""

    title: str
    header: Row
    rows: list[Row] = field(default_factory=list)
    data: list[dict[str, Any]] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def print(self) -> None:
        """Print the title, the table, the notes and the goal lines."""
        print()
        print(f"== {self.title} ==")
        print_table(self.header, self.rows)
        for note in self.notes:
            print(f"  {note}")
        for goal in self.goals:
            print(f"  goal {goal.line()}")

    def as_dict(self) -> dict[str, Any]:
        """Return the section as JSON."""
        return {"title": self.title, "header": list(self.header), "rows": [list(r) for r in self.rows],
                "data": self.data, "goals": [g.as_dict() for g in self.goals], "notes": self.notes}


#: One mode of :func:`versus_reference`: its label, rows per timed round and its methods, reference first.
Mode = tuple[str, int, list[tuple[str, Method]]]


#: The goal of an append against a plain insert of the same rows at the same durability.
WRITE_GOAL = 0.9


def versus_reference(section: Section, modes: Sequence[Mode], repeat: int, goal_modes: set[str]) -> None:
    """Time each mode's methods interleaved (short rounds: :data:`SHORT_ROUNDS` x ``repeat``) and add their rows.

    The first method of a mode is its reference; for a mode in ``goal_modes`` the last
    method's throughput over the reference's is a goal of :data:`WRITE_GOAL`.
    """
    for mode, n, methods in modes:
        got = interleaved(methods, SHORT_ROUNDS * repeat)
        ref = Stat.of(got[methods[0][0]]).median
        for name, _ in methods:
            st = Stat.of(got[name])
            section.rows.append((mode, name, f"{n:,}", seconds(st.min), seconds(st.median), seconds(st.max),
                                 rate(n / st.median), ratio(ref / st.median)))
            section.data.append({"mode": mode, "method": name, "rows": n, **st.as_dict(),
                                 "rows_per_s": n / st.median, "vs_reference": ref / st.median})
        if mode in goal_modes:
            section.goals.append(Goal(f"{mode}: compactstore / plain", ref / Stat.of(got[methods[-1][0]]).median,
                                      WRITE_GOAL))


def print_table(header: Row, rows: Sequence[Row]) -> None:
    """Print rows under header: first two columns left-aligned, the rest right-aligned.

    A first cell equal to the row above's is blanked, and a blank line separates groups.
    """
    if not rows:
        print("(no rows)")
        return
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(row: Row) -> str:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(cells).rstrip()

    print(fmt(header))
    print("  ".join("-" * w for w in widths))
    previous = None
    for row in rows:
        if previous is not None and row[0] != previous:
            print()
        print(fmt(row if row[0] != previous else ("", *row[1:])))
        previous = row[0]


def write_json(name: str, info: dict[str, Any], sections: Sequence[Section], **extra: Any) -> Path:
    """Write ``benchmarks/results/<name>.json`` and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "machine": info, **extra, "sections": [s.as_dict() for s in sections]}
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    return path


def peak_rss_mb() -> float:
    """Return this process's peak resident set size so far, in MB (10**6 bytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def disk_bytes(path: str | os.PathLike[str]) -> int:
    """Return the bytes a SQLite database occupies: the file plus its -wal and -shm, if any."""
    total = 0
    for suffix in ("", "-wal", "-shm", "-journal"):
        p = Path(f"{os.fspath(path)}{suffix}")
        if p.exists():
            total += p.stat().st_size
    return total
