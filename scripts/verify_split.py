#!/usr/bin/env python3
"""Per-verify time split of `specdec-kimi generate --json` runs (scripts/device_run.sh).

    verify_split.py RUN.json...

One line per run: its speculative configuration, tensor-parallel size, whether its tokens equal
the first run's of the same configuration, decode tokens/s, accept length and the milliseconds
per verify of each phase (draft, build, verify, commit, extend). When a NONE run is among them,
one more line per other run of the same tensor-parallel size: its whole speculative step over the
plain step (the cost of one step; speedup = accept length / this ratio) and whether its tokens
equal NONE's (greedy speculation is lossless). A run with "device_resident_step": false (a CUDA
EAGLE run with --disable-device-step: the proposal read back to the host) is labelled so, and
its tokens are compared with the first run of its configuration (the device-resident one).
"""
import json
import sys


def name(j):
    config = j["speculative_config"]
    read_back = j.get("device_resident_step") is False and not config.startswith("NONE")
    return config + (" (--disable-device-step)" if read_back else "")


def main(paths):
    runs, first = [], {}
    for path in paths:
        with open(path) as f:
            j = json.load(f)
        per = {k: 1e3 * v / max(j["verify_ct"], 1) for k, v in j["time_s"].items() if k != "prefill"}
        tp = j.get("tp_size", 1)
        same = first.setdefault(j["speculative_config"], j["output_ids"]) == j["output_ids"]
        runs.append((j, tp, per))
        print(name(j), "| tp %d | same tokens as the first run: %s" % (tp, same),
              "| decode tokens/s %.1f | accept length %.3f | per verify (ms): %s"
              % (j["decode_tokens_per_s"], j["accept_length"],
                 ", ".join("%s %.3f" % kv for kv in per.items())))
    plain = {tp: (sum(per.values()), j["output_ids"]) for j, tp, per in runs
             if j["speculative_config"].startswith("NONE")}
    for j, tp, per in runs:
        if tp in plain and not j["speculative_config"].startswith("NONE"):
            step, (plain_step, plain_ids) = sum(per.values()), plain[tp]
            print("%s | tp %d | one step %.3f ms = %.3fx the plain step (%.3f ms); pays from "
                  "accept length %.2f | same tokens as NONE: %s"
                  % (name(j), tp, step, step / plain_step, plain_step,
                     step / plain_step, j["output_ids"] == plain_ids))


if __name__ == "__main__":
    main(sys.argv[1:])
