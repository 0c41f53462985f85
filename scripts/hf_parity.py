#!/usr/bin/env python3
"""Hugging Face transformers parity fixture for the Kimi / DeepseekV3 CPU reference forward.

Runs on the H200 machine (python3 with torch + transformers + safetensors; no network needed):

    python3 scripts/hf_parity.py --specdec-kimi build-h200/examples/specdec-kimi --out DIR

1. `specdec-kimi init-random --preset tiny --out DIR/ckpt --seed 1` writes the tiny bf16
   DeepseekV3 checkpoint (flat config, model_type deepseek_v3; DIR/ckpt must not exist or be empty).
2. transformers.DeepseekV3ForCausalLM loads it from local files only (HF_HUB_OFFLINE=1,
   local_files_only=True), twice: torch_dtype float32 and bfloat16, eager attention, TF32 off.
   Loading must report no missing / unexpected / mismatched tensors, and the parameters must have
   the requested dtype (an ignored dtype argument would otherwise go unnoticed).
3. On fixed input ids (24 ids from torch.Generator seeded 1234, drawn from [4, vocab) so that
   bos / eos / pad of the tiny preset (1, 2, 3) never occur) at positions 0..23 it records the fp32
   logits of the last 4 positions, and greedy decodes 64 tokens with each dtype. Greedy is a plain
   loop of full forwards without a KV cache (argmax of the last row, first index on ties, no stop
   on eos), exactly what kimi_forward_reference computes, so generate()'s settings play no part.
4. Writes DIR/hf_parity_fixture.json:
     {"config_name": "tiny", "seed": 1, "model_type", "transformers_version", "torch_version",
      "device", "input_ids": [24], "start_position": 0,
      "logits_positions": [20, 21, 22, 23], "logits_last4": [4][vocab] (fp32 run),
      "greedy_tokens": {"float32": [64], "bfloat16": [64]},
      "e_score_correction_bias_dtype": {"float32": ..., "bfloat16": ...}}

The fixture is meant to be committed as tests/fixtures/hf_parity_tiny.json and compared by a unit
test (which comes when the fixture exists): the test regenerates the same checkpoint with
write_random_preset(dir, "tiny", seed 1, bf16, 1 shard), runs kimi_forward_reference on input_ids,
compares the 4 logit rows within a tolerance (the reference computes in fp32 with double
accumulation; the fp32 transformers run differs only by summation order and fp32 rope angles) and
the fp32 greedy tokens exactly (or up to the first near-tie). The bf16 greedy tokens are recorded
to show how far bf16 rounding alone moves the output; they are not expected to match.

With --int4 the checkpoint has INT4 routed experts (`init-random --int4`); transformers, which
reads dense weights, runs on the copy `specdec-kimi dequantize` writes (float32 experts equal to
our INT4 path's dequantised weights exactly), in float32 only, and the fixture is
DIR/hf_parity_fixture_int4.json ("int4": true, no bfloat16 tokens), to be committed as
tests/fixtures/hf_parity_tiny_int4.json and compared with our forward on the INT4 original.

With --checkpoint DIR it checks an existing checkpoint instead (the trained demo model,
tools/demo): no init-random; INT4 when its config.json has a quantization_config; input ids from
--input-ids (a real prompt) or random; the fixture is DIR/hf_parity_<--name>.json (config_name
<--name>, seed null), compared by unit.kimi_hf_parity with the checkpoint as shipped.

Checks that fail loudly instead of producing a misleading fixture: rope_interleave must be true
(the interleaved convention kimi.md describes), and under YaRN max_position_embeddings /
original_max_position_embeddings must equal rope_scaling.factor (transformers versions differ in
which one they use; the C++ reference refuses configs where they differ).
"""

import argparse
import json
import os
import subprocess
import sys

# No network: set before transformers / huggingface_hub are imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

NUM_INPUT_IDS = 24
INPUT_SEED = 1234
FIRST_ORDINARY_ID = 4  # tiny preset: bos 1, eos 2, pad 3
NUM_LOGIT_ROWS = 4
NUM_GREEDY = 64


def fail(msg):
    print("hf_parity.py: error: " + msg, file=sys.stderr)
    sys.exit(1)


def run_tool(cmd):
    print("+ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd)
    if r.returncode != 0:
        fail("%s exited with %d" % (" ".join(cmd), r.returncode))


def write_checkpoint(specdec_kimi, ckpt_dir, seed, int4):
    if not os.path.isfile(specdec_kimi) or not os.access(specdec_kimi, os.X_OK):
        fail("--specdec-kimi %s: not an executable file (build it first)" % specdec_kimi)
    if os.path.exists(ckpt_dir) and os.listdir(ckpt_dir):
        fail("%s exists and is not empty: pass a fresh --out (the checkpoint writer never "
             "overwrites)" % ckpt_dir)
    cmd = [specdec_kimi, "init-random", "--preset", "tiny", "--out", ckpt_dir, "--seed", str(seed)]
    if int4:
        cmd.append("--int4")
    run_tool(cmd)
    for name in ("config.json", "model.safetensors"):
        if not os.path.isfile(os.path.join(ckpt_dir, name)):
            fail("%s did not write %s" % (ckpt_dir, name))
    return cmd


def check_config(cfg, ckpt_dir):
    if cfg.model_type != "deepseek_v3":
        fail("%s/config.json: model_type %r, expected 'deepseek_v3' (flat tiny preset)"
             % (ckpt_dir, cfg.model_type))
    if not getattr(cfg, "rope_interleave", True):
        fail("%s: transformers config has rope_interleave false; the reference uses interleaved "
             "rope pairs" % ckpt_dir)
    rs = getattr(cfg, "rope_scaling", None) or {}
    if rs and "original_max_position_embeddings" in rs:
        ratio = cfg.max_position_embeddings / rs["original_max_position_embeddings"]
        if abs(ratio - rs["factor"]) > 1e-9 * rs["factor"]:
            fail("%s: rope_scaling.factor %r != max_position_embeddings / "
                 "original_max_position_embeddings = %r" % (ckpt_dir, rs["factor"], ratio))


def load_model(torch, transformers, ckpt_dir, dtype, device):
    cfg = transformers.DeepseekV3Config.from_pretrained(ckpt_dir, local_files_only=True)
    check_config(cfg, ckpt_dir)
    model, info = transformers.DeepseekV3ForCausalLM.from_pretrained(
        ckpt_dir, config=cfg, torch_dtype=dtype, local_files_only=True,
        attn_implementation="eager", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in
           ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")}
    # Non-persistent buffers such as rotary inv_freq are never in a checkpoint; anything else is.
    if "missing_keys" in bad:
        bad["missing_keys"] = [k for k in bad["missing_keys"] if not k.endswith("inv_freq")]
        if not bad["missing_keys"]:
            del bad["missing_keys"]
    if bad:
        fail("%s loaded as %s with problems: %r" % (ckpt_dir, dtype, bad))
    p = next(model.parameters())
    if p.dtype != dtype:
        fail("%s: parameters are %s, asked for %s" % (ckpt_dir, p.dtype, dtype))
    model.to(device)
    model.eval()
    bias = None
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            bias = str(buf.dtype)
            break
    for name, prm in model.named_parameters():
        if bias is None and name.endswith("e_score_correction_bias"):
            bias = str(prm.dtype)
    return model, bias


def greedy(torch, model, input_ids, n):
    ids = input_ids.clone()
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=ids, use_cache=False).logits[0, -1]
            nxt = int(torch.argmax(logits.float()).item())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]], dtype=ids.dtype, device=ids.device)], 1)
    return out


def report_cuda_executor(specdec_kimi, ckpt_dir, input_list, fixture):
    """Our CUDA executor's greedy tokens on the same checkpoint, against transformers' (printed,
    never written to the fixture: a fixture holds only what transformers computed). The CUDA
    executor rounds GEMM activations to bf16, so it is expected to track the fp32 tokens up to a
    near-tie, as the bf16 transformers run does."""
    cmd = [specdec_kimi, "generate", "--model-path", ckpt_dir, "--device", "cuda", "--json",
           "--ignore-eos", "--max-new-tokens", str(NUM_GREEDY),
           "--input-ids", ",".join(str(v) for v in input_list)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 and "built without CUDA" in r.stderr:
        print("specdec cuda vs transformers: not compared (%s was built without CUDA)"
              % specdec_kimi, flush=True)
        return
    if r.returncode != 0:
        fail("%s failed (%d): %s" % (" ".join(cmd[:4]), r.returncode, r.stderr.strip()))
    ours = json.loads(r.stdout)["output_ids"]
    for name, theirs in fixture["greedy_tokens"].items():
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
        print("specdec cuda vs transformers %s greedy: first %d of %d tokens identical"
              % (name, first, NUM_GREEDY), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specdec-kimi", required=True, help="path of the specdec-kimi binary")
    ap.add_argument("--out", required=True, help="output directory (checkpoint + fixture)")
    ap.add_argument("--seed", type=int, default=1, help="checkpoint seed (default 1)")
    ap.add_argument("--int4", action="store_true",
                    help="INT4 experts: transformers runs (float32 only) on the exact float32 "
                         "copy written by `specdec-kimi dequantize`")
    ap.add_argument("--checkpoint", help="an existing checkpoint directory to check instead of "
                    "the tiny preset (INT4 experts when its config says so); the fixture is "
                    "DIR/hf_parity_<--name>.json")
    ap.add_argument("--name", default="demo", help="the fixture's config_name with --checkpoint")
    ap.add_argument("--input-ids", help="comma-separated input ids (default: %d random ids)"
                    % NUM_INPUT_IDS)
    args = ap.parse_args()

    try:
        import torch
        import transformers
    except ImportError as e:
        fail("needs torch and transformers: %s" % e)
    if not hasattr(transformers, "DeepseekV3ForCausalLM"):
        fail("transformers %s has no DeepseekV3ForCausalLM (needs >= 4.51)"
             % transformers.__version__)

    os.makedirs(args.out, exist_ok=True)
    if args.checkpoint:
        ckpt_dir = args.checkpoint
        with open(os.path.join(ckpt_dir, "config.json")) as f:
            args.int4 = "quantization_config" in json.load(f)
        cmd = None
    else:
        ckpt_dir = os.path.join(args.out, "ckpt")
        cmd = write_checkpoint(args.specdec_kimi, ckpt_dir, args.seed, args.int4)
    hf_dir = ckpt_dir
    if args.int4:
        hf_dir = os.path.join(args.out, "ckpt-f32")
        run_tool([args.specdec_kimi, "dequantize", "--model-path", ckpt_dir, "--out", hf_dir])

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # fp32 means fp32: no TF32 matmuls / convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)

    with open(os.path.join(ckpt_dir, "config.json")) as f:
        raw = json.load(f)
    vocab = int(raw["vocab_size"])
    gen = torch.Generator().manual_seed(INPUT_SEED)
    input_ids = torch.randint(FIRST_ORDINARY_ID, vocab, (1, NUM_INPUT_IDS), generator=gen)
    if args.input_ids:
        input_ids = torch.tensor([[int(v) for v in args.input_ids.split(",")]])
        if input_ids.numel() < NUM_LOGIT_ROWS or int(input_ids.max()) >= vocab:
            fail("--input-ids: need >= %d ids in [0, %d)" % (NUM_LOGIT_ROWS, vocab))
    n_ids = input_ids.shape[1]
    input_list = [int(v) for v in input_ids[0].tolist()]
    input_ids = input_ids.to(device)

    fixture = {
        "config_name": args.name if args.checkpoint else "tiny",
        "seed": None if args.checkpoint else args.seed,
        "checkpoint_command": (" ".join(["specdec-kimi"] + cmd[1:5] + ["DIR/ckpt"] + cmd[6:])
                               if cmd else "existing checkpoint " + ckpt_dir),
        "int4": args.int4,
        "model_type": raw.get("model_type"),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "device": device,
        "input_ids": input_list,
        "start_position": 0,
        "logits_positions": list(range(n_ids - NUM_LOGIT_ROWS, n_ids)),
        "greedy_tokens": {},
        "e_score_correction_bias_dtype": {},
    }

    runs = [("float32", torch.float32)]
    if not args.int4:  # a bf16 load of the float32 copy would round the exact INT4 products
        runs.append(("bfloat16", torch.bfloat16))
    for name, dtype in runs:
        print("loading %s as %s on %s" % (hf_dir, name, device), flush=True)
        model, bias_dtype = load_model(torch, transformers, hf_dir, dtype, device)
        fixture["e_score_correction_bias_dtype"][name] = bias_dtype
        if name == "float32":
            with torch.no_grad():
                logits = model(input_ids=input_ids, use_cache=False).logits[0].float()
            if logits.shape != (n_ids, vocab):
                fail("logits shape %s, expected (%d, %d)" % (tuple(logits.shape), n_ids, vocab))
            if not torch.isfinite(logits).all():
                fail("fp32 logits are not all finite")
            fixture["logits_last4"] = [[float(v) for v in row]
                                       for row in logits[-NUM_LOGIT_ROWS:].cpu().tolist()]
        fixture["greedy_tokens"][name] = greedy(torch, model, input_ids, NUM_GREEDY)
        print("%s greedy: %s" % (name, fixture["greedy_tokens"][name]), flush=True)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()

    suffix = "_int4" if args.int4 else ""
    path = os.path.join(args.out, "hf_parity_fixture%s.json" % suffix)
    if args.checkpoint:
        path = os.path.join(args.out, "hf_parity_%s.json" % args.name)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    if args.int4:
        print("wrote %s" % path)
    else:
        same = sum(a == b for a, b in zip(fixture["greedy_tokens"]["float32"],
                                          fixture["greedy_tokens"]["bfloat16"]))
        print("wrote %s (fp32 vs bf16 greedy agree at %d of %d)" % (path, same, NUM_GREEDY))
    print("commit it as tests/fixtures/%s" % (os.path.basename(path) if args.checkpoint
                                               else "hf_parity_tiny%s.json" % suffix))
    if device == "cuda":
        report_cuda_executor(args.specdec_kimi, ckpt_dir, input_list, fixture)


if __name__ == "__main__":
    main()
