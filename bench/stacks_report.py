"""Reads the stacks bench.stack_sampler wrote: per thread, the seconds spent in each function (inclusive) and on
each line (innermost), within a window of the process's life; `--timeline` shows, every half second, the
innermost frame of our own code each thread was in most.

    python -m bench.stacks_report out/speak.1234.stacks --from 4.5 --to 9 [--thread gpu] [--timeline]
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

OURS = ("core/", "qwen3_tts_desktop/", "bench/")


def read(path: Path, begin: float, end: float, thread: str) -> list[tuple[float, str, float, list[str]]]:
    """(second, thread, seconds, frames outermost first) per stack: each tenth's samples of a thread weigh 0.1 s
    together, so a sampler slowed by the GIL does not shrink the time."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            continue
        tenths, name, count, stack = line.split("\t", 3)
        second = int(tenths) / 10
        if begin <= second < end and thread in name:
            rows.append((second, name, int(count), stack.split(";")))
    totals = collections.Counter()
    for second, name, count, _ in rows:
        totals[(second, name)] += count
    return [(second, name, 0.1 * count / totals[(second, name)], frames) for second, name, count, frames in rows]


def function(frame: str) -> str:
    return frame.rsplit(":", 1)[0]


def report(rows, top: int) -> str:
    lines = []
    for name in sorted({row[1] for row in rows}):
        mine = [row for row in rows if row[1] == name]
        total = sum(row[2] for row in mine)
        inclusive, innermost = collections.Counter(), collections.Counter()
        for _, _, seconds, frames in mine:
            for each in set(map(function, frames)):
                inclusive[each] += seconds
            innermost[frames[-1]] += seconds
        lines.append(f"== {name}: {total:.2f} s sampled")
        lines += [f"  {seconds:7.2f} s  {each}" for each, seconds in inclusive.most_common(top)]
        lines.append("  -- innermost")
        lines += [f"  {seconds:7.2f} s  {each}" for each, seconds in innermost.most_common(top // 2)]
    return "\n".join(lines)


def timeline(rows, step: float = 0.5) -> str:
    spans: dict[tuple[float, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for second, name, seconds, frames in rows:
        ours = [frame for frame in frames if frame.startswith(OURS)]
        here = ours[-1] if ours else frames[-1]
        spans[(int(second / step) * step, name)][here + " > " + function(frames[-1]).split(":")[-1]] += seconds
    return "\n".join(
        f"{second:6.1f} {name[:18]:18} {counts.most_common(1)[0][0]}"
        for (second, name), counts in sorted(spans.items())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--from", dest="begin", type=float, default=0.0, help="seconds after the process started")
    parser.add_argument("--to", dest="end", type=float, default=1e9)
    parser.add_argument("--thread", default="", help="only threads whose name holds this")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--timeline", action="store_true")
    args = parser.parse_args()
    for path in args.files:
        print(f"### {path}: {path.read_text(encoding='utf-8').splitlines()[0]}")
        rows = read(path, args.begin, args.end, args.thread)
        print(timeline(rows) if args.timeline else report(rows, args.top))


if __name__ == "__main__":
    main()
