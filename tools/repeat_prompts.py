#!/usr/bin/env python3
"""Writes a repeated workload for specdec-generate --prompts: every line of a JSON Lines prompt
file repeated N times, in an order shuffled with a fixed seed (a stand-in for agents and repeated
tasks, which ask for what earlier requests already produced). Standard library only.

    python3 tools/repeat_prompts.py ../shared/data/tinystories_prompts.jsonl 20 > repeated.jsonl
"""
import argparse
import random
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", help="a JSON Lines file of prompts")
    parser.add_argument("times", type=int, help="how many times each prompt is asked (>= 1)")
    parser.add_argument("--seed", type=int, default=1, help="the shuffle's seed (default 1)")
    args = parser.parse_args()
    if args.times < 1:
        parser.error("times must be at least 1")
    with open(args.prompts, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    if not lines:
        parser.error(f"{args.prompts} holds no prompt")
    workload = [line for line in lines for _ in range(args.times)]
    random.Random(args.seed).shuffle(workload)
    sys.stdout.write("\n".join(workload) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
