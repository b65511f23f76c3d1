#!/usr/bin/env python3
"""Prints every bar of the GPU path from the CUDA benchmarks' JSON output (Google Benchmark's
--benchmark_out), one line each: the figure, the bar, PASS or FAIL, and the yardstick it was
measured against in the same run. Missing benchmarks are reported as MISSING.

    python3 tests/backend/cuda/bars.py OUT/bench_e2e.json OUT/bench_sampling.json \
        OUT/bench_verify.json

Bars (one H100):
- fixture autoregressive on the GPU >= 10,000 tokens/s;
- draft model (k = 3 or 4) >= 1.2x autoregressive, prompt lookup >= 1.3x, Medusa, Hydra and
  EAGLE heads >= 1.8x, in the same run;
- TinyLlama shape, bf16: a decode step <= 1.3x (step bytes / read bandwidth), 5 tokens <= 1.15x
  one token;
- top-k 50 and top-p 0.9 sampling from logits <= 5x the copy of the rows at batch 1, <= 3x at
  batch >= 16;
- chain verification from logits (k = 4) <= 10 us at batch 1.
"""
import json
import sys

failed = 0


def load(paths):
    runs = {}
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"cannot read {path}: {e}")
            continue
        for b in doc.get("benchmarks", []):
            runs[b.get("run_name", b["name"])] = b
    return runs


def bar(name, value, limit, higher_is_better, detail):
    global failed
    if value is None:
        print(f"MISSING  {name}")
        failed += 1
        return
    ok = value >= limit if higher_is_better else value <= limit
    failed += 0 if ok else 1
    sign = ">=" if higher_is_better else "<="
    print(f"{'PASS' if ok else 'FAIL':7}  {name}: {value:.3f} ({sign} {limit}); {detail}")


def find(runs, prefix):
    """The run whose name is `prefix` or starts with `prefix/` (Google Benchmark appends
    /iterations:N/manual_time and the like)."""
    for name, b in runs.items():
        if name == prefix or name.startswith(prefix + "/"):
            return b
    return None


def counter(runs, prefix, field):
    b = find(runs, prefix)
    if b is None or b.get("error_occurred") or "error_message" in b:
        return None, b
    return b.get(field), b


def main():
    runs = load(sys.argv[1:])
    # 1. Fixture.
    tps, b = counter(runs, "fixture/autoregressive", "tok_per_s")
    bar("fixture autoregressive tokens/s", tps, 10000, True, "stories260K, 14 prompts x 128")
    for key, limit, label in [("fixture/draft_k3", 1.2, "draft model k=3"),
                              ("fixture/draft_k4", 1.2, "draft model k=4"),
                              ("fixture/prompt_lookup", 1.3, "prompt lookup")]:
        s, b = counter(runs, key, "speedup")
        detail = "vs autoregressive in the same run"
        if b is not None and s is not None:
            detail += (f": {b.get('tok_per_s', 0):.0f} vs {b.get('base_tok_per_s', 0):.0f} "
                       f"tokens/s, accepted length {b.get('accepted_len', 0):.2f}")
        bar(f"{label} speedup", s, limit, True, detail)
    for key, label in [("fixture/medusa", "Medusa heads"), ("fixture/hydra", "Hydra heads"),
                       ("fixture/eagle1", "EAGLE-2 (EAGLE-1 head)"), ("fixture/eagle3", "EAGLE-3")]:
        s, b = counter(runs, key, "speedup")
        detail = "vs autoregressive in the same run"
        if b is not None and s is not None:
            detail += (f": {b.get('tok_per_s', 0):.0f} vs {b.get('base_tok_per_s', 0):.0f} "
                       f"tokens/s, accepted length {b.get('accepted_len', 0):.2f}")
        bar(f"{label} speedup", s, 1.8, True, detail)
    s, b = counter(runs, "fixture/draft_k4_host_verify", "speedup")
    if s is not None:
        print(f"info     draft model k=4 with host verification: {s:.3f}x")
    # 2. TinyLlama shape.
    for dtype in ["f32", "f16", "bf16"]:
        x, b = counter(runs, f"tinyllama/{dtype}", "x_bw")
        if b is None:
            continue
        detail = (f"{b.get('ms', 0):.3f} ms, {b.get('step_GB', 0):.3f} GB at "
                  f"{b.get('read_GB/s', 0):.0f} GB/s read bandwidth")
        if dtype == "bf16":
            bar("TinyLlama bf16 decode step / (bytes / bandwidth)", x, 1.3, False, detail)
            bar("TinyLlama bf16 5 tokens / 1 token", b.get("x_one"), 1.15, False,
                f"{b.get('ms_5', 0):.3f} ms vs {b.get('ms', 0):.3f} ms")
        else:
            print(f"info     TinyLlama {dtype}: x_bw {x:.3f}, 5/1 tokens {b.get('x_one', 0):.3f}; "
                  f"{detail}")
    if find(runs, "tinyllama/bf16") is None:
        bar("TinyLlama bf16 decode step / (bytes / bandwidth)", None, 1.3, False, "")
    # 3. Sampling.
    for policy, label in [(1, "top-k 50"), (2, "top-p 0.9")]:
        for rows in [1, 16, 64]:
            for vocab in [32000, 128256]:
                limit = 5 if rows == 1 else 3
                worst = None
                for peaked in [1, 0]:
                    key = f"BM_sample/rows:{rows}/vocab:{vocab}/policy:{policy}/peaked:{peaked}"
                    x, b = counter(runs, key, "x_floor")
                    if x is not None:
                        worst = x if worst is None else max(worst, x)
                detail = "peaked and flat rows, the worse"
                pivot_us, _ = counter(runs, f"BM_sample/rows:{rows}/vocab:{vocab}/policy:{policy}"
                                      "/peaked:1", "us")
                radix_us, _ = counter(runs, f"BM_sample_radix/rows:{rows}/vocab:{vocab}/"
                                      f"policy:{policy}", "us")
                if pivot_us is not None and radix_us is not None:
                    detail += (f"; peaked rows: {pivot_us:.1f} us, the earlier radix + walk "
                               f"pipeline {radix_us:.1f} us in the same run")
                bar(f"{label} sampling, batch {rows}, vocab {vocab}, x copy", worst, limit, False,
                    detail)
    # 4. Chain verification.
    for vocab in [32000, 128256]:
        us, b = counter(runs, f"BM_chain_verify/batch:1/k:4/vocab:{vocab}/probs:0", "us")
        bar(f"chain verification from logits, batch 1, k 4, vocab {vocab}, us", us, 10, False,
            f"x copy {b.get('x_floor', 0):.2f}" if b else "")
    print(f"{failed} bar(s) not met" if failed else "every bar met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
