#!/usr/bin/env python3
"""Writes long prompts for measurements at a long context: prompt i is TinyStories story i
followed by the next stories (wrapping around), cut at a number of characters (default 800,
about 400 tokens of tok512), one JSON object per line ({"id", "prompt"}), as specdec-generate
--prompts reads them.

    python3 tools/long_prompts.py ../shared/data/tinystories_prompts.jsonl 800 > long.jsonl
"""
import json
import sys


def main() -> None:
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        stories = [json.loads(line)["story"] for line in f if line.strip()]
    length = int(sys.argv[2]) if len(sys.argv) == 3 else 800
    for i in range(len(stories)):
        text, j = "", i
        while len(text) < length:
            text += stories[j % len(stories)] + "\n"
            j += 1
        print(json.dumps({"id": i, "prompt": text[:length]}))


if __name__ == "__main__":
    main()
