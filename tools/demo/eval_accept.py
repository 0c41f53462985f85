#!/usr/bin/env python3
"""Measures the demo's speculative decoding on held-out prompts with specdec-kimi itself.

    python3 tools/demo/eval_accept.py --specdec-kimi BIN --model-path TARGET --draft DRAFT \
        --prompts prompts_heldout.jsonl [--count 16] [--max-new-tokens 96] [--out eval.json]

For each of the first --count prompts ({"input_ids": [...]} per line) it runs `specdec-kimi
generate --json --ignore-eos` greedily twice: plain (NONE) and EAGLE-3 as a chain of 3 draft steps
(4 verified tokens). The two outputs must be equal token for token (greedy speculation is
lossless); any difference is an error. It reports the accept length over all prompts (tokens
committed per verify, bonus included, over all verifies of all prompts; the first token, drawn
at prefill, is not a verify's),
per-position acceptance and both decode rates (means over the prompts; their ratio is
decode_speedup), and writes them with the per-prompt figures to --out. It also reports how
repetitive the target's greedy text is: the share of generated tokens that complete a 5-gram
already seen in the prompt or the output (any drafter gains on repeated text; n-gram lookup
gains on nothing else), per prompt and over all prompts (repeated_5gram_share). The
*_generate_seconds are whole generate calls, each in a fresh process: they include one-time
work (the draft's prefill, the first cuBLAS calls, capturing each CUDA graph shape), so they are
no speed figure.
Exit status 1 on a mismatch or a failed run.

    python3 tools/demo/eval_accept.py --self-test   (ctest demo.eval_accept: the 5-gram count)
"""

import argparse
import json
import subprocess
import sys

CHAIN3 = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
          "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print("eval_accept: %s failed (%d):\n%s" % (" ".join(cmd[:3]), r.returncode, r.stderr),
              file=sys.stderr)
        sys.exit(1)
    return json.loads(r.stdout)


def repeated_ngram_count(prompt, output, n=5):
    """How many tokens of `output` complete an n-gram that occurred earlier in prompt + output."""
    seq = list(prompt) + list(output)
    seen, count = set(), 0
    for j in range(n - 1, len(seq)):
        gram = tuple(seq[j - n + 1: j + 1])
        count += j >= len(prompt) and gram in seen
        seen.add(gram)
    return count


def self_test():
    """repeated_ngram_count against counts written out by hand."""
    cases = [
        ([1, 2, 3, 4], [5, 1, 2, 3, 4, 5, 9], 1),  # 1 2 3 4 5 comes again; 2 3 4 5 9 is new
        ([], [7] * 7, 2),                           # 7 7 7 7 7 at rows 4, 5, 6: the last two repeat
        ([1, 2, 3, 4, 5], [], 0),                   # no output
        ([1, 2, 3, 4, 5], [1, 2, 3, 4, 6], 0),      # one token short of the prompt's 5-gram
        ([1, 2, 3, 4, 5, 1, 2, 3, 4], [5], 1),      # the prompt's own 5-gram comes back
        ([9, 9], [9, 9, 9, 9], 1),                  # 5-grams start inside the prompt
    ]
    bad = 0
    for prompt, output, want in cases:
        got = repeated_ngram_count(prompt, output)
        if got != want:
            print("eval_accept self-test: repeated_ngram_count(%s, %s) = %d, want %d" % (
                prompt, output, got, want), file=sys.stderr)
            bad += 1
    print("eval_accept self-test: %d of %d cases right" % (len(cases) - bad, len(cases)))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--self-test", action="store_true", help="check the 5-gram count (ctest)")
    ap.add_argument("--specdec-kimi")
    ap.add_argument("--model-path")
    ap.add_argument("--draft")
    ap.add_argument("--prompts")
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.self_test:
        sys.exit(self_test())
    for flag in ("specdec_kimi", "model_path", "draft", "prompts"):
        if getattr(a, flag) is None:
            ap.error("--%s is required (or --self-test)" % flag.replace("_", "-"))

    prompts = [json.loads(line)["input_ids"] for line in open(a.prompts) if line.strip()]
    prompts = prompts[: a.count]
    base = [a.specdec_kimi, "generate", "--model-path", a.model_path, "--json", "--ignore-eos",
            "--device", a.device, "--max-new-tokens", str(a.max_new_tokens)]
    rows, mismatches = [], 0
    tokens = verifies = generated = repeated = 0
    accepted = None
    plain_s = spec_s = plain_dtps = spec_dtps = 0.0
    for i, p in enumerate(prompts):
        ids = ["--input-ids", ",".join(str(v) for v in p)]
        plain = run(base + ids + ["--speculative-algorithm", "NONE"])
        spec = run(base + ids + CHAIN3 + ["--speculative-draft-model-path", a.draft,
                                          "--no-self-check"])
        same = plain["output_ids"] == spec["output_ids"]
        mismatches += not same
        n = len(spec["output_ids"])
        rep = repeated_ngram_count(p, plain["output_ids"])
        generated += len(plain["output_ids"])
        repeated += rep
        tokens += spec["accept_length"] * spec["verify_ct"]  # committed by verifies
        verifies += spec["verify_ct"]
        per = spec["per_position_accept"]
        # per-position acceptance is accepted / proposed at that depth: weight by verifies
        if accepted is None:
            accepted = [0.0] * len(per)
        for k, v in enumerate(per):
            accepted[k] += v * spec["verify_ct"]
        plain_s += plain["seconds"]
        spec_s += spec["seconds"]
        plain_dtps += plain["decode_tokens_per_s"]
        spec_dtps += spec["decode_tokens_per_s"]
        rows.append({"prompt": i, "accept_length": spec["accept_length"],
                     "same_tokens": same, "tokens": n, "verify_ct": spec["verify_ct"],
                     "repeated_5gram_share": rep / max(len(plain["output_ids"]), 1)})
        print("prompt %2d: accept length %.3f, %s, repeated 5-grams %.2f" % (
            i, spec["accept_length"], "same tokens" if same else "MISMATCH",
            rows[-1]["repeated_5gram_share"]), flush=True)
    summary = {
        "prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "device": a.device,
        "config": "EAGLE3 chain: steps 3, topk 1, 4 verified tokens; temperature 0",
        "accept_length": tokens / max(verifies, 1),
        "per_position_accept": [v / max(verifies, 1) for v in (accepted or [])],
        "mismatches": mismatches,
        "plain_generate_seconds": plain_s, "speculative_generate_seconds": spec_s,
        "plain_decode_tokens_per_s": plain_dtps / max(len(prompts), 1),
        "speculative_decode_tokens_per_s": spec_dtps / max(len(prompts), 1),
        "decode_speedup": spec_dtps / plain_dtps if plain_dtps > 0 else None,
        "repeated_5gram_share": repeated / max(generated, 1),
        "per_prompt": rows,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "per_prompt"}, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)
    if mismatches:
        print("eval_accept: %d prompts differ between plain and speculative decoding" % mismatches,
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
