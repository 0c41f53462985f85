#!/usr/bin/env python3
"""Train an EAGLE-3 draft (one Llama decoder layer, SpecForge layout) on a `specdec-kimi capture`.

Runs on the GPU machine (python3 with torch >= 2.1 and safetensors; transformers is not needed):

    python3 tools/demo/train_eagle3.py --capture cap0.safetensors [cap1.safetensors ...] \
        --target TARGET_DIR --out DRAFT_DIR [--ttt-steps 4] [--minutes 3.5] ...
    python3 tools/demo/train_eagle3.py --self-test        # seconds; CPU, and CUDA when present

The draft's math is our engine's (include/specdec/model/eagle/forward_cpu.hpp). One entry, for
input token t (a target id) and incoming hidden h [H]:
    x = [rms(embed(t), input_layernorm) | rms(h, hidden_norm)] (2H), residual r = h
    q, k, v = x q_proj^T, x k_proj^T, x v_proj^T; NeoX rope (pairs (i, i + hd/2),
    inv_freq_i = 1 / rope_theta^(2i / hd)) on q and k at the entry's position
    o_h = sum_u softmax_u(q_h . k_{u, h // (nh / nkv)} / sqrt(hd)) v_u over the visible entries u
    h' = r + o_proj(o); h'' = h' + down(silu(gate(n)) * up(n)), n = rms(h', post_attention_layernorm)
    logits = lm_head(rms(h'', norm)) [Vd]; rms(x, w) = w * x / sqrt(mean(x^2) + eps)
The embedding is the TARGET's model.embed_tokens.weight (frozen; the checkpoint has none).

Training-time test (TTT), for a sequence t_0 .. t_{L-1} with target features f_p and the target's
next-token distribution at each row p (top-K; row p predicts t_{p+1}):
    entry (i, 0)  token t_{i+1}, h = fc(f_i), position i, sees (j, 0) for j <= i   (draft_extend)
    entry (i, k)  token t_{i+k+1}, h = h'' of (i, k-1), position i + k, sees (j, 0) for j <= i and
                  (i, 1) .. (i, k)                                                 (draft_step)
    entry (i, k) is trained toward the target's distribution at row i + k + 1 (valid while
    i + k + 1 < L), with a soft cross-entropy over the renormalised top-K, weighted 0.8^k.
Batched: step k's scores are Q_k K_0^T (causal, key padding masked) beside the diagonal terms
Q_k . K_m (m = 1..k), one softmax over both. --self-test checks this against a brute-force
fp64 evaluation of every entry from an explicit list of the entries it sees.

Outputs in --out: config.json, model.safetensors (bf16 weights, d2t int64, t2d bool; the tensors
and rules of include/specdec/model/eagle/weights.hpp, checked again after writing) and
train_report.json (steps, time, losses, held-out per-step agreement with the target's argmax,
chain agreement and the accept length it predicts for chains of 1..ttt_steps).
"""

import argparse
import glob
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time

try:
    import torch
    import torch.nn.functional as F
    from safetensors import safe_open
    from safetensors.torch import save_file, load_file
except ImportError as e:  # pragma: no cover
    sys.stderr.write("train_eagle3.py needs torch and safetensors: %s\n" % e)
    sys.exit(2)

CAPTURE_FORMAT = "specdec-capture-v1"
CAPTURE_TENSORS = ["input_ids", "seq_starts", "prompt_lengths", "aux_hidden", "topk_ids",
                   "topk_logprobs"]
STEP_WEIGHT = 0.8  # SpecForge's default: step k weighs 0.8^k

# The float tensors of an EAGLE-3 draft, in weights.hpp's order.
FLOAT_NAMES = [
    "fc.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "norm.weight",
    "lm_head.weight",
]
NORM_NAMES = {"midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
              "midlayer.post_attention_layernorm.weight", "norm.weight"}


class TrainError(Exception):
    pass


def fail(msg):
    raise TrainError(msg)


def log(msg):
    print(msg, flush=True)


class Dims(object):
    """The draft's sizes. H = hidden (= the target's), Fw = fc input width (|layers| * H)."""

    def __init__(self, H, Fw, nh, nkv, hd, I, V, Vd, eps, theta):
        self.H, self.Fw, self.nh, self.nkv, self.hd, self.I = H, Fw, nh, nkv, hd, I
        self.V, self.Vd, self.eps, self.theta = V, Vd, eps, theta
        if nh % nkv != 0:
            fail("--heads %d is not a multiple of --kv-heads %d" % (nh, nkv))
        if hd % 2 != 0:
            fail("--head-dim %d must be even (NeoX rope rotates the two halves)" % hd)

    def shapes(self):
        H, Q, KV = self.H, self.nh * self.hd, self.nkv * self.hd
        return {
            "fc.weight": [H, self.Fw],
            "midlayer.hidden_norm.weight": [H],
            "midlayer.input_layernorm.weight": [H],
            "midlayer.post_attention_layernorm.weight": [H],
            "midlayer.self_attn.q_proj.weight": [Q, 2 * H],
            "midlayer.self_attn.k_proj.weight": [KV, 2 * H],
            "midlayer.self_attn.v_proj.weight": [KV, 2 * H],
            "midlayer.self_attn.o_proj.weight": [H, Q],
            "midlayer.mlp.gate_proj.weight": [self.I, H],
            "midlayer.mlp.up_proj.weight": [self.I, H],
            "midlayer.mlp.down_proj.weight": [H, self.I],
            "norm.weight": [H],
            "lm_head.weight": [self.Vd, H],
        }


# ---------------------------------------------------------------------------------------------
# The target: config and the tensors the draft reads.

def read_target(target_dir):
    path = os.path.join(target_dir, "config.json")
    if not os.path.isfile(path):
        fail("%s: no config.json (--target is the target checkpoint's directory)" % target_dir)
    with open(path) as f:
        root = json.load(f)
    text = root.get("text_config") if isinstance(root.get("text_config"), dict) else None
    cfg = text if text is not None else root
    where = "text_config." if text is not None else ""

    def field(name, required=True, default=None):
        if cfg.get(name) is not None:
            return cfg[name]
        if text is not None and root.get(name) is not None:
            return root[name]
        if required:
            fail("%s: field '%s%s' is missing" % (path, where, name))
        return default

    t = {
        "dir": target_dir,
        "config_path": path,
        "hidden_size": int(field("hidden_size")),
        "vocab_size": int(field("vocab_size")),
        "num_hidden_layers": int(field("num_hidden_layers")),
        "max_position_embeddings": int(field("max_position_embeddings")),
        "rms_norm_eps": float(field("rms_norm_eps")),
        "tie_word_embeddings": bool(field("tie_word_embeddings", False, False)),
        "prefix": "language_model." if text is not None else "",
    }
    return t


def target_tensor_files(target_dir):
    """name -> file of every tensor of the target checkpoint."""
    index = os.path.join(target_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            wm = json.load(f).get("weight_map")
        if not isinstance(wm, dict):
            fail("%s: no weight_map object" % index)
        return {name: os.path.join(target_dir, fn) for name, fn in wm.items()}
    single = os.path.join(target_dir, "model.safetensors")
    files = [single] if os.path.isfile(single) else sorted(
        glob.glob(os.path.join(target_dir, "*.safetensors")))
    if not files:
        fail("%s: no model.safetensors.index.json, model.safetensors or *.safetensors: the draft "
             "reads the target's embedding from its checkpoint (a --config-only checkpoint has "
             "none)" % target_dir)
    out = {}
    for fn in files:
        with safe_open(fn, framework="pt", device="cpu") as f:
            for k in f.keys():
                out[k] = fn
    return out


def read_target_tensor(files, candidates, what, required=True):
    for name in candidates:
        if name in files:
            with safe_open(files[name], framework="pt", device="cpu") as f:
                return f.get_tensor(name), name
    if required:
        fail("the target checkpoint has no %s (looked for %s)" % (what, ", ".join(candidates)))
    return None, None


def target_names(prefix, tail):
    names = [prefix + tail]
    for p in ["", "language_model."]:
        if p + tail not in names:
            names.append(p + tail)
    return names


# ---------------------------------------------------------------------------------------------
# Capture files.

class Data(object):
    """Every capture on the device. Rows are tokens; sequence s is rows [starts[s], +lens[s])."""
    pass


def expand_captures(groups):
    paths = []
    for group in groups:
        for p in group:
            if any(c in p for c in "*?["):
                hits = sorted(glob.glob(p))
                if not hits:
                    fail("--capture %s matches no file" % p)
                paths.extend(hits)
            else:
                paths.append(p)
    seen, out = set(), []
    for p in paths:
        a = os.path.abspath(p)
        if a not in seen:
            seen.add(a)
            out.append(p)
    if not out:
        fail("no --capture file given")
    return out


def parse_layers(text, where):
    try:
        ids = [int(x) for x in str(text).split(",") if x.strip() != ""]
    except ValueError:
        fail("%s: metadata layers %r is not a comma-separated list of integers" % (where, text))
    if not ids:
        fail("%s: metadata layers is empty" % where)
    return ids


def read_capture_file(path):
    if not os.path.isfile(path):
        fail("capture %s: no such file" % path)
    with safe_open(path, framework="pt", device="cpu") as f:
        meta = f.metadata() or {}
        keys = set(f.keys())
        if meta.get("format") != CAPTURE_FORMAT:
            fail("capture %s: metadata format %r, expected %r (a file of `specdec-kimi capture`)"
                 % (path, meta.get("format"), CAPTURE_FORMAT))
        missing = [k for k in CAPTURE_TENSORS if k not in keys]
        if missing:
            fail("capture %s: missing tensors %s" % (path, ", ".join(missing)))
        tensors = {k: f.get_tensor(k) for k in CAPTURE_TENSORS}
    for k in ["layers", "hidden_size", "vocab_size", "num_hidden_layers"]:
        if k not in meta:
            fail("capture %s: metadata has no %r" % (path, k))
    return meta, tensors


def load_captures(paths, target, device):
    V, H, N = target["vocab_size"], target["hidden_size"], target["num_hidden_layers"]
    ref, ref_path, K, parts = None, None, None, []
    for p in paths:
        meta, t = read_capture_file(p)
        key = (",".join(str(i) for i in parse_layers(meta["layers"], p)), int(meta["hidden_size"]),
               int(meta["vocab_size"]), int(meta["num_hidden_layers"]))
        if ref is None:
            ref, ref_path = key, p
        elif key != ref:
            fail("capture %s: (layers, hidden_size, vocab_size, num_hidden_layers) = %s differ "
                 "from %s's %s: every capture must come from the same target and layer set"
                 % (p, key, ref_path, ref))
        ids, starts, plens = t["input_ids"], t["seq_starts"], t["prompt_lengths"]
        aux, tk_ids, tk_lp = t["aux_hidden"], t["topk_ids"], t["topk_logprobs"]
        T = ids.shape[0] if ids.dim() == 1 else -1
        if T < 0:
            fail("capture %s: input_ids must be 1-D, got %s" % (p, list(ids.shape)))
        S = starts.shape[0] - 1
        if starts.dim() != 1 or S < 0 or plens.dim() != 1 or plens.shape[0] != S:
            fail("capture %s: seq_starts %s / prompt_lengths %s: expected [S+1] / [S]"
                 % (p, list(starts.shape), list(plens.shape)))
        st = starts.to(torch.int64)
        if S > 0 and (int(st[0]) != 0 or int(st[-1]) != T or bool((st[1:] < st[:-1]).any())):
            fail("capture %s: seq_starts must rise from 0 to the token count %d" % (p, T))
        L = len(key[0].split(","))
        if aux.dim() != 2 or aux.shape[0] != T or aux.shape[1] != L * key[1]:
            fail("capture %s: aux_hidden %s, expected [%d, %d] (|layers| %d x hidden %d)"
                 % (p, list(aux.shape), T, L * key[1], L, key[1]))
        if tk_ids.dim() != 2 or tk_ids.shape[0] != T or tk_lp.shape != tk_ids.shape:
            fail("capture %s: topk_ids %s / topk_logprobs %s, expected [%d, K] both"
                 % (p, list(tk_ids.shape), list(tk_lp.shape), T))
        if K is None:
            K = tk_ids.shape[1]
        elif tk_ids.shape[1] != K:
            fail("capture %s: top-K %d != %d of %s" % (p, tk_ids.shape[1], K, ref_path))
        if T > 0:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= V:
                fail("capture %s: input_ids in [%d, %d], outside the target vocabulary [0, %d)"
                     % (p, lo, hi, V))
            lo, hi = int(tk_ids.min()), int(tk_ids.max())
            if lo < 0 or hi >= V:
                fail("capture %s: topk_ids in [%d, %d], outside [0, %d)" % (p, lo, hi, V))
        parts.append((p, t, st))
    layers = parse_layers(ref[0], ref_path)
    if ref[1] != H or ref[2] != V or ref[3] != N:
        fail("captures (%s): hidden_size %d, vocab_size %d, num_hidden_layers %d != the target's "
             "%d, %d, %d (%s)" % (ref_path, ref[1], ref[2], ref[3], H, V, N,
                                  target["config_path"]))
    if len(set(layers)) != len(layers) or min(layers) < -1 or max(layers) >= N:
        fail("captures: layers %s is not a valid layer set for the %d-layer target (distinct ids "
             "in [-1, %d))" % (layers, N, N))

    Ttot = sum(int(t["input_ids"].shape[0]) for _, t, _ in parts)
    Fw = len(layers) * H
    d = Data()
    d.files = paths
    d.layers = layers
    d.K = K
    d.ids = torch.empty(Ttot, dtype=torch.int64, device=device)
    d.aux = torch.empty((Ttot, Fw), dtype=torch.bfloat16, device=device)
    d.tk_ids = torch.empty((Ttot, K), dtype=torch.int64, device=device)
    d.tk_lp = torch.empty((Ttot, K), dtype=torch.float32, device=device)
    starts, lens, plens = [], [], []
    off = 0
    for p, t, st in parts:
        T = int(t["input_ids"].shape[0])
        d.ids[off:off + T] = t["input_ids"].to(torch.int64).to(device)
        d.aux[off:off + T] = t["aux_hidden"].to(device).to(torch.bfloat16)
        d.tk_ids[off:off + T] = t["topk_ids"].to(torch.int64).to(device)
        d.tk_lp[off:off + T] = t["topk_logprobs"].to(device).to(torch.float32)
        stl = st.tolist()
        pl = t["prompt_lengths"].to(torch.int64).tolist()
        for s in range(len(stl) - 1):
            starts.append(off + stl[s])
            lens.append(stl[s + 1] - stl[s])
            plens.append(max(0, min(pl[s], stl[s + 1] - stl[s])))
        off += T
        del t
    d.total_tokens = Ttot
    d.all_seqs = len(lens)
    keep = [s for s in range(len(lens)) if lens[s] >= 2]  # a sequence of 1 token has no entry
    d.starts_list = [starts[s] for s in keep]
    d.lens_list = [lens[s] for s in keep]
    d.plens_list = [plens[s] for s in keep]
    d.starts = torch.tensor(d.starts_list, dtype=torch.int64, device=device)
    d.lens = torch.tensor(d.lens_list, dtype=torch.int64, device=device)
    d.plens = torch.tensor(d.plens_list, dtype=torch.int64, device=device)
    if not d.lens_list:
        fail("captures %s hold no sequence of 2 or more tokens" % ", ".join(paths))
    return d


def greedy_consistency(d):
    """How often the data's next token is the target's argmax (rows p with p + 1 in the
    sequence): the TTT inputs t_{i+k+1} equal what a chain would feed only where it is."""
    cnt = d.lens - 1                                   # rows p with p + 1 in the sequence
    n = int(cnt.sum())
    base = torch.repeat_interleave(d.starts, cnt)
    rel = torch.arange(n, device=d.ids.device) - torch.repeat_interleave(
        torch.cumsum(cnt, 0) - cnt, cnt)
    rows = base + rel
    resp = rel >= torch.repeat_interleave((d.plens - 1).clamp(min=0), cnt)
    arg = d.tk_ids[rows].gather(1, d.tk_lp[rows].argmax(1, keepdim=True)).squeeze(1)
    same = arg == d.ids[rows + 1]
    ok_all, n_all = int(same.sum()), n
    ok_resp, n_resp = int((same & resp).sum()), int(resp.sum())
    return {"all_rows": ok_all / max(n_all, 1), "response_rows": ok_resp / max(n_resp, 1),
            "rows": n_all, "response_rows_count": n_resp}


# ---------------------------------------------------------------------------------------------
# The draft: parameters, the batched TTT forward, the loss.

def init_params(dims, gen, lm_head_init=None, norm_init=None):
    """fp32 parameters on the CPU: N(0, 0.02^2), norms 1; lm_head / norm from the target when
    given."""
    P = {}
    for name, shape in dims.shapes().items():
        if name in NORM_NAMES:
            P[name] = torch.ones(shape, dtype=torch.float32)
        else:
            P[name] = torch.randn(shape, generator=gen, dtype=torch.float32) * 0.02
    if lm_head_init is not None:
        P["lm_head.weight"] = lm_head_init.to(torch.float32).clone().contiguous()
    if norm_init is not None:
        P["norm.weight"] = norm_init.to(torch.float32).clone().contiguous()
    return P


def rope_tables(dims, positions, device, dtype):
    """cos / sin [positions, hd/2]: angle = p * inv_freq_i, inv_freq_i = 1 / theta^(2i / hd),
    in double as the engine computes them."""
    half = dims.hd // 2
    inv = torch.tensor([1.0 / (dims.theta ** (2.0 * i / dims.hd)) for i in range(half)],
                       dtype=torch.float64)
    ang = torch.arange(positions, dtype=torch.float64).unsqueeze(1) * inv.unsqueeze(0)
    return ang.cos().to(device=device, dtype=dtype), ang.sin().to(device=device, dtype=dtype)


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def apply_rope(x, cos, sin):
    """x [B, heads, T, hd]; cos / sin [T, hd/2]; rotate-half (NeoX)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Prec(object):
    """mm: the matmul dtype (bf16 on CUDA for training); acc: everything else (fp32; fp64 in the
    self-test's exact comparison)."""

    def __init__(self, mm, acc):
        self.mm, self.acc = mm, acc


def cast_weights(P, prec):
    """Once per step: matrices in the matmul dtype, norms in the accumulation dtype (the casts are
    differentiable, so the fp32 master weights get the gradients)."""
    return {k: (v.to(prec.mm) if v.dim() == 2 else v.to(prec.acc)) for k, v in P.items()}


def lin(x, w, prec):
    return F.linear(x.to(prec.mm), w).to(prec.acc)


def ttt_forward(W, embed, tok, feat, lens, dims, steps, rope, prec):
    """h'' [B, T, H] of every entry (i, k), one tensor per step k.
    tok [B, T] the sequences' tokens (padded), feat [B, T, Fw] their target features, lens [B]."""
    B, T = tok.shape
    dev = tok.device
    H, nh, nkv, hd, eps = dims.H, dims.nh, dims.nkv, dims.hd, dims.eps
    group = nh // nkv
    scale = 1.0 / math.sqrt(hd)
    cos_all, sin_all = rope
    if cos_all.shape[0] < T + steps:
        fail("internal: rope table of %d positions, need %d" % (cos_all.shape[0], T + steps))
    ar = torch.arange(T, device=dev)
    key_ok = ar.unsqueeze(0) < lens.unsqueeze(1)                         # [B, T(j)]
    causal = ar.unsqueeze(0) <= ar.unsqueeze(1)                          # [T(i), T(j)]
    allowed = (causal.unsqueeze(0) & key_ok.unsqueeze(1)).unsqueeze(1)   # [B, 1, T, T]
    h = lin(feat, W["fc.weight"], prec)                                  # [B, T, H]
    keys, vals, outs = [], [], []
    k0_mm = v0_mm = None
    for k in range(steps):
        idx = torch.clamp(ar + (k + 1), max=T - 1)
        tok_k = tok.index_select(1, idx)                                 # t_{i+k+1}
        e = embed[tok_k].to(prec.acc)
        x = torch.cat([rms(e, W["midlayer.input_layernorm.weight"], eps),
                       rms(h, W["midlayer.hidden_norm.weight"], eps)], dim=-1)
        q = lin(x, W["midlayer.self_attn.q_proj.weight"], prec).view(B, T, nh, hd).transpose(1, 2)
        kk = lin(x, W["midlayer.self_attn.k_proj.weight"], prec).view(B, T, nkv, hd).transpose(1, 2)
        vv = lin(x, W["midlayer.self_attn.v_proj.weight"], prec).view(B, T, nkv, hd).transpose(1, 2)
        cos, sin = cos_all[k:k + T], sin_all[k:k + T]                    # positions i + k
        q = apply_rope(q, cos, sin)
        kk = apply_rope(kk, cos, sin)
        if group > 1:  # query head h reads kv head h // group
            kk = kk.repeat_interleave(group, dim=1)
            vv = vv.repeat_interleave(group, dim=1)
        keys.append(kk)
        vals.append(vv)
        if k == 0:
            k0_mm = kk.to(prec.mm).transpose(-1, -2)
            v0_mm = vv.to(prec.mm)
        s = torch.matmul(q.to(prec.mm), k0_mm).to(prec.acc) * scale       # [B, nh, T, T]
        s = s.masked_fill(~allowed, float("-inf"))
        if k > 0:
            diag = torch.stack([(q * keys[m]).sum(-1) for m in range(1, k + 1)], dim=-1) * scale
            s = torch.cat([s, diag], dim=-1)                             # [B, nh, T, T + k]
        p = torch.softmax(s, dim=-1)
        o = torch.matmul(p[..., :T].to(prec.mm), v0_mm).to(prec.acc)
        for m in range(1, k + 1):
            o = o + p[..., T + m - 1].unsqueeze(-1) * vals[m]
        o = o.transpose(1, 2).reshape(B, T, nh * hd)
        h1 = h + lin(o, W["midlayer.self_attn.o_proj.weight"], prec)
        n1 = rms(h1, W["midlayer.post_attention_layernorm.weight"], eps)
        act = F.silu(lin(n1, W["midlayer.mlp.gate_proj.weight"], prec)) * \
            lin(n1, W["midlayer.mlp.up_proj.weight"], prec)
        h2 = h1 + lin(act, W["midlayer.mlp.down_proj.weight"], prec)
        outs.append(h2)
        h = h2
    return outs


def head_logits(W, rows, dims, prec):
    return lin(rms(rows, W["norm.weight"], dims.eps), W["lm_head.weight"], prec)


class Vocab(object):
    """t2d_index [V]: draft id of a target id or -1; d2t_target [Vd]: target id of a draft id."""

    def __init__(self, chosen, V, device):
        chosen = sorted(chosen)
        self.Vd = len(chosen)
        self.d2t_target = torch.tensor(chosen, dtype=torch.int64, device=device)
        self.d2t = self.d2t_target - torch.arange(self.Vd, dtype=torch.int64, device=device)
        self.t2d = torch.zeros(V, dtype=torch.bool, device=device)
        self.t2d[self.d2t_target] = True
        self.t2d_index = torch.full((V,), -1, dtype=torch.int64, device=device)
        self.t2d_index[self.d2t_target] = torch.arange(self.Vd, dtype=torch.int64, device=device)


def make_batch(d, seq_ids):
    dev = d.ids.device
    sid = torch.tensor(seq_ids, dtype=torch.int64, device=dev)
    starts, lens, plens = d.starts[sid], d.lens[sid], d.plens[sid]
    T = max(d.lens_list[s] for s in seq_ids)
    ar = torch.arange(T, device=dev)
    g = starts.unsqueeze(1) + torch.minimum(ar.unsqueeze(0), (lens - 1).unsqueeze(1))  # [B, T]
    return {"tok": d.ids[g], "feat": d.aux[g], "tk_ids": d.tk_ids[g], "tk_lp": d.tk_lp[g],
            "lens": lens, "plens": plens, "T": T}


def batch_losses(W, embed, batch, dims, steps, rope, prec, vocab, response_only=False,
                 want_layout=False):
    """Per step k: loss (mean soft CE over the valid rows, a tensor), rows, agreements (tensors),
    and with want_layout the valid mask and the agreement [B, T] (for chain statistics)."""
    tok, lens, plens, T = batch["tok"], batch["lens"], batch["plens"], batch["T"]
    feat = batch["feat"]
    if feat.dtype != prec.acc and prec.acc == torch.float64:
        feat = feat.to(torch.float64)
    outs = ttt_forward(W, embed, tok, feat, lens, dims, steps, rope, prec)
    ar = torch.arange(T, device=tok.device)
    start_ok = ar.unsqueeze(0) >= (plens - 1).unsqueeze(1)
    res = []
    for k, h2 in enumerate(outs):
        valid = (ar + (k + 1)).unsqueeze(0) < lens.unsqueeze(1)          # label row i+k+1 < L
        if response_only:
            valid = valid & start_ok
        idx = torch.clamp(ar + (k + 1), max=T - 1)
        lab_ids = batch["tk_ids"].index_select(1, idx)[valid]             # [N, K]
        lab_lp = batch["tk_lp"].index_select(1, idx)[valid].to(prec.acc)
        rows = h2[valid]
        r = {"valid": valid, "rows": int(rows.shape[0])}
        if r["rows"] == 0:
            r["loss"] = None
            r["agree"] = 0
            if want_layout:
                r["agree_bt"] = torch.zeros_like(valid)
            res.append(r)
            continue
        logits = head_logits(W, rows, dims, prec)                         # [N, Vd]
        did = vocab.t2d_index[lab_ids]
        inside = did >= 0
        row_ok = inside.any(-1)
        lp = lab_lp.masked_fill(~inside, float("-inf"))
        lp = torch.where(row_ok.unsqueeze(-1), lp, torch.zeros_like(lp))
        prob = torch.softmax(lp, dim=-1) * inside.to(prec.acc)
        picked = logits.gather(-1, did.clamp(min=0))
        ce = torch.logsumexp(logits, dim=-1) - (prob * picked).sum(-1)
        w = row_ok.to(prec.acc)
        r["loss"] = (ce * w).sum() / w.sum().clamp(min=1.0)
        with torch.no_grad():
            tgt_top = lab_ids.gather(-1, lab_lp.argmax(-1, keepdim=True)).squeeze(-1)
            drf_top = vocab.d2t_target[logits.argmax(-1)]
            agree = drf_top == tgt_top
            r["agree"] = agree.sum()
            if want_layout:
                bt = torch.zeros_like(valid)
                bt[valid] = agree
                r["agree_bt"] = bt
        res.append(r)
    return res


# ---------------------------------------------------------------------------------------------
# Export and the loader's checks (weights.hpp / config.hpp), redone in Python.

def draft_config(dims, layers, target, max_pos):
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "attention_bias": False,
        "draft_vocab_size": dims.Vd,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layers),
                         "use_aux_hidden_state": True},
        "head_dim": dims.hd,
        "hidden_act": "silu",
        "hidden_size": dims.H,
        "intermediate_size": dims.I,
        "max_position_embeddings": max_pos,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": dims.nh,
        "num_hidden_layers": 1,
        "num_key_value_heads": dims.nkv,
        "rms_norm_eps": dims.eps,
        "rope_scaling": None,
        "rope_theta": float(dims.theta),
        "target_hidden_size": target["hidden_size"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": dims.V,
    }


def export_draft(out_dir, P, vocab, config):
    os.makedirs(out_dir, exist_ok=True)
    tensors = {}
    for name in FLOAT_NAMES:
        tensors[name] = P[name].detach().to(torch.bfloat16).cpu().contiguous()
    tensors["d2t"] = vocab.d2t.detach().to(torch.int64).cpu().contiguous()
    tensors["t2d"] = vocab.t2d.detach().to(torch.bool).cpu().contiguous()
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    return tensors


def check_export(out_dir, target):
    """Reads out_dir back and checks what our loader checks; returns (config, tensors)."""
    cpath = os.path.join(out_dir, "config.json")
    with open(cpath) as f:
        c = json.load(f)
    need = ["architectures", "hidden_size", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
            "max_position_embeddings", "vocab_size", "draft_vocab_size", "target_hidden_size",
            "eagle_config", "num_hidden_layers"]
    missing = [k for k in need if k not in c]
    if missing:
        fail("%s: missing fields %s" % (cpath, missing))
    if "LlamaForCausalLMEagle3" not in c["architectures"]:
        fail("%s: architectures %s" % (cpath, c["architectures"]))
    if c["num_hidden_layers"] != 1 or c.get("rope_scaling") is not None:
        fail("%s: num_hidden_layers must be 1 and rope_scaling null" % cpath)
    if c.get("hidden_act", "silu") != "silu" or c.get("attention_bias") or c.get("mlp_bias"):
        fail("%s: hidden_act silu, no biases" % cpath)
    if c["num_attention_heads"] % c["num_key_value_heads"] or c["head_dim"] % 2:
        fail("%s: heads / kv heads / head_dim" % cpath)
    if not (c["rms_norm_eps"] > 0 and c["rope_theta"] > 0 and c["max_position_embeddings"] > 0):
        fail("%s: eps, rope_theta and max_position_embeddings must be > 0" % cpath)
    V, Vd, H = c["vocab_size"], c["draft_vocab_size"], c["hidden_size"]
    if V != target["vocab_size"] or c["target_hidden_size"] != target["hidden_size"]:
        fail("%s: vocab_size / target_hidden_size differ from the target's" % cpath)
    if not (1 <= Vd <= V):
        fail("%s: draft_vocab_size %d outside [1, %d]" % (cpath, Vd, V))
    if H != c["target_hidden_size"]:
        fail("%s: hidden_size != target_hidden_size and no embed_tokens.weight" % cpath)
    ec = c["eagle_config"]
    ids = ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None
    N = target["num_hidden_layers"]
    if (not isinstance(ids, list) or not ids or len(set(ids)) != len(ids)
            or min(ids) < -1 or max(ids) >= N or ec.get("use_aux_hidden_state") is not True):
        fail("%s: eagle_config %s is not a valid layer set for the %d-layer target"
             % (cpath, ec, N))
    dims = Dims(H, len(ids) * c["target_hidden_size"], c["num_attention_heads"],
                c["num_key_value_heads"], c["head_dim"], c["intermediate_size"], V, Vd,
                c["rms_norm_eps"], c["rope_theta"])
    spath = os.path.join(out_dir, "model.safetensors")
    t = load_file(spath)
    schema = dims.shapes()
    expected = set(schema) | {"d2t", "t2d"}
    if set(t.keys()) != expected:
        fail("%s: tensors %s, expected exactly %s" % (spath, sorted(t.keys()), sorted(expected)))
    for name, shape in schema.items():
        if list(t[name].shape) != shape or t[name].dtype != torch.bfloat16:
            fail("%s: %s is %s %s, expected bfloat16 %s"
                 % (spath, name, t[name].dtype, list(t[name].shape), shape))
        if not bool(torch.isfinite(t[name].float()).all()):
            fail("%s: %s has non-finite values" % (spath, name))
    d2t, t2d = t["d2t"], t["t2d"]
    if d2t.dtype != torch.int64 or list(d2t.shape) != [Vd]:
        fail("%s: d2t is %s %s, expected int64 [%d]" % (spath, d2t.dtype, list(d2t.shape), Vd))
    if t2d.dtype != torch.bool or list(t2d.shape) != [V]:
        fail("%s: t2d is %s %s, expected bool [%d]" % (spath, t2d.dtype, list(t2d.shape), V))
    if int(t2d.sum()) != Vd:
        fail("%s: t2d marks %d ids != draft_vocab_size %d" % (spath, int(t2d.sum()), Vd))
    tid = torch.arange(Vd, dtype=torch.int64) + d2t
    if int(tid.min()) < 0 or int(tid.max()) >= V:
        fail("%s: d + d2t[d] outside [0, %d)" % (spath, V))
    if not bool(t2d[tid].all()) or int(torch.unique(tid).numel()) != Vd:
        fail("%s: d2t and t2d disagree (a mapped id not marked, or reached twice)" % spath)
    return c, t


# ---------------------------------------------------------------------------------------------
# Training.

def make_batches(seq_ids, lens, batch_seqs, max_tokens, gen=None):
    """Batches of up to batch_seqs sequences and max_tokens padded tokens; with gen, shuffled
    (sequences of similar length are batched together within chunks, then batches shuffled)."""
    ids = list(seq_ids)
    if gen is not None:
        perm = torch.randperm(len(ids), generator=gen).tolist()
        ids = [ids[i] for i in perm]
    chunk = max(batch_seqs * 32, 1)
    batches = []
    for c0 in range(0, len(ids), chunk):
        part = sorted(ids[c0:c0 + chunk], key=lambda s: lens[s])
        cur, cur_max = [], 0
        for s in part:
            m = max(cur_max, lens[s])
            if cur and (len(cur) >= batch_seqs or (len(cur) + 1) * m > max_tokens):
                batches.append(cur)
                cur, m = [], lens[s]
            cur.append(s)
            cur_max = m
        if cur:
            batches.append(cur)
    if gen is not None:
        perm = torch.randperm(len(batches), generator=gen).tolist()
        batches = [batches[i] for i in perm]
    return batches


def lr_at(step, base, warmup, total):
    if step < warmup:
        return base * float(step + 1) / float(warmup)
    if total is None:
        return base
    prog = min(1.0, float(step - warmup) / float(max(1, total - warmup)))
    return base * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * prog)))


def evaluate(W, embed, d, seq_ids, dims, steps, rope, prec, vocab, batch_seqs, max_tokens):
    """Held-out: per step k loss, agreement with the target's argmax, chain agreement (steps
    0..k all agree from the same start i), over all starts and over response starts."""
    S = steps
    acc = {sel: {"rows": [0] * S, "agree": [0] * S, "chain": [0] * S, "chain_prev": [0] * S,
                 "loss": [0.0] * S} for sel in ("all", "response")}
    with torch.no_grad():
        for b in make_batches(seq_ids, d.lens_list, batch_seqs, max_tokens):
            batch = make_batch(d, b)
            res = batch_losses(W, embed, batch, dims, S, rope, prec, vocab, want_layout=True)
            T = batch["T"]
            ar = torch.arange(T, device=batch["tok"].device)
            resp = ar.unsqueeze(0) >= (batch["plens"] - 1).unsqueeze(1)
            chain = None
            for k, r in enumerate(res):
                prev = chain
                chain = r["agree_bt"] if k == 0 else (chain & r["agree_bt"])
                for sel in ("all", "response"):
                    m = r["valid"] if sel == "all" else (r["valid"] & resp)
                    a = acc[sel]
                    a["rows"][k] += int(m.sum())
                    a["agree"][k] += int((r["agree_bt"] & m).sum())
                    a["chain"][k] += int((chain & m).sum())
                    a["chain_prev"][k] += int(m.sum()) if k == 0 else int((prev & m).sum())
                if r["loss"] is not None:
                    acc["all"]["loss"][k] += float(r["loss"]) * r["rows"]
    out = {}
    for sel, a in acc.items():
        rows = a["rows"]
        agree = [a["agree"][k] / rows[k] if rows[k] else None for k in range(S)]
        chain = [a["chain"][k] / rows[k] if rows[k] else None for k in range(S)]
        cond = [a["chain"][k] / a["chain_prev"][k] if a["chain_prev"][k] else None
                for k in range(S)]
        accept = []
        for n in range(1, S + 1):
            vals = [x for x in chain[:n] if x is not None]
            accept.append(1.0 + sum(vals))
        out[sel] = {"rows_per_step": rows, "agreement_per_step": agree,
                    "chain_agreement_per_step": chain, "per_position_accept": cond,
                    "predicted_accept_length_chain_1_to_S": accept}
        if sel == "all":
            out[sel]["loss_per_step"] = [a["loss"][k] / rows[k] if rows[k] else None
                                         for k in range(S)]
    return out


def pick_precision(args, device):
    p = args.precision
    if p == "auto":
        p = "bf16" if device.type == "cuda" else "fp32"
    if p == "bf16":
        return Prec(torch.bfloat16, torch.float32)
    if p == "fp32":
        return Prec(torch.float32, torch.float32)
    if p == "fp64":
        return Prec(torch.float64, torch.float64)
    fail("--precision %s: expected auto, bf16, fp32 or fp64" % args.precision)


def fmt(xs, f="%.3f"):
    return " ".join("-" if x is None else (f % x) for x in xs)


def train(args):
    t_load = time.time()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        fail("--device %s: CUDA is not available (torch %s)" % (args.device, torch.__version__))
    if args.ttt_steps < 1:
        fail("--ttt-steps must be >= 1")
    torch.manual_seed(args.seed)
    prec = pick_precision(args, device)
    target = read_target(args.target)
    d = load_captures(expand_captures(args.capture), target, device)
    V, H = target["vocab_size"], target["hidden_size"]
    layers = d.layers
    S = args.ttt_steps

    files = target_tensor_files(args.target)
    pre = target["prefix"]
    embed, embed_name = read_target_tensor(files, target_names(pre, "model.embed_tokens.weight"),
                                           "embedding (model.embed_tokens.weight)")
    if list(embed.shape) != [V, H]:
        fail("target %s is %s, expected [%d, %d]" % (embed_name, list(embed.shape), V, H))
    if target["tie_word_embeddings"]:
        lm_head, lm_name = embed, embed_name
    else:
        lm_head, lm_name = read_target_tensor(files, target_names(pre, "lm_head.weight"),
                                              "lm_head", required=False)
    norm, norm_name = read_target_tensor(files, target_names(pre, "model.norm.weight"),
                                         "final norm", required=False)
    if lm_head is not None and list(lm_head.shape) != [V, H]:
        log("warning: target %s is %s, not [%d, %d]: lm_head starts random"
            % (lm_name, list(lm_head.shape), V, H))
        lm_head = None
    if norm is not None and list(norm.shape) != [H]:
        norm = None

    # Draft vocabulary: the whole target vocabulary, or the N most frequent capture tokens.
    if args.draft_vocab and 0 < args.draft_vocab < V:
        counts = torch.bincount(d.ids, minlength=V).cpu().tolist()
        order = sorted(range(V), key=lambda t: (-counts[t], t))
        chosen = order[:args.draft_vocab]
    else:
        chosen = list(range(V))
    vocab = Vocab(chosen, V, device)
    dims = Dims(H, len(layers) * H, args.heads, args.kv_heads, args.head_dim, args.intermediate,
                V, vocab.Vd, target["rms_norm_eps"], args.rope_theta)

    gen = torch.Generator()
    gen.manual_seed(args.seed)
    if not args.init_lm_head:
        lm_head = None
    lm_src = "random" if lm_head is None else "rows of the target's " + lm_name
    P = init_params(dims, gen,
                    lm_head_init=None if lm_head is None else lm_head[vocab.d2t_target.cpu()],
                    norm_init=norm)
    P = {k: v.to(device).requires_grad_(True) for k, v in P.items()}
    embed = embed.to(device)
    if prec.acc == torch.float64:
        embed = embed.to(torch.float64)
    del lm_head
    max_len = max(d.lens_list)
    rope = rope_tables(dims, max_len + S + 1, device, prec.acc)

    n_seq = len(d.lens_list)
    perm = torch.randperm(n_seq, generator=gen).tolist()
    n_held = 0 if n_seq < 2 else max(1, int(round(args.heldout_frac * n_seq)))
    held, train_ids = sorted(perm[:n_held]), perm[n_held:]
    max_tokens = args.max_batch_tokens
    if max_tokens <= 0:  # bound the fp32 logits: ~1.5e9 values per TTT step
        max_tokens = int(min(16384, max(1024, 1.5e9 // dims.Vd)))
    gc = greedy_consistency(d)
    n_params = sum(v.numel() for v in P.values())
    log("data: %d capture file(s), %d sequences (%d with >= 2 tokens), %d tokens, top-%d, layers "
        "%s; held out %d sequences; data token == target argmax on %.3f of rows (%.3f of response "
        "rows)" % (len(d.files), d.all_seqs, n_seq, d.total_tokens, d.K, layers, n_held,
                   gc["all_rows"], gc["response_rows"]))
    log("draft: H %d, heads %d/%d x %d, I %d, vocab %d/%d, %.1fM params, ttt %d, %s matmuls, "
        "device %s, batch <= %d seqs / %d tokens; lm_head %s, norm %s; embedding %s (%s); "
        "loaded in %.1f s" % (H, dims.nh, dims.nkv, dims.hd, dims.I, dims.Vd, V, n_params / 1e6,
                              S, str(prec.mm).replace("torch.", ""), device, args.batch_seqs,
                              max_tokens, lm_src, norm_name or "ones", embed_name,
                              str(embed.dtype).replace("torch.", ""), time.time() - t_load))
    if not train_ids:
        fail("no training sequences (--heldout-frac %.3f of %d)" % (args.heldout_frac, n_seq))
    params = [P[k] for k in FLOAT_NAMES]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0, eps=1e-8)
    budget = args.minutes * 60.0
    warmup = max(1, args.warmup)
    total = None
    step = 0
    window = []  # last steps' [loss_k..., rows_k..., agree_k...]
    log_acc, log_acc_n = None, 0
    t0 = time.time()
    t_mark, step_mark = None, 0
    last_print = t0
    tokens_since = 0
    first_loss0 = None
    stop = False
    epoch = 0
    while not stop:
        epoch += 1
        for b in make_batches(train_ids, d.lens_list, args.batch_seqs, max_tokens, gen):
            now = time.time()
            if now - t0 >= budget or (args.max_steps and step >= args.max_steps):
                stop = True
                break
            lr = lr_at(step, args.lr, warmup, total)
            for g in opt.param_groups:
                g["lr"] = lr
            batch = make_batch(d, b)
            W = cast_weights(P, prec)
            res = batch_losses(W, embed, batch, dims, S, rope, prec, vocab,
                               response_only=args.response_only)
            terms = [(STEP_WEIGHT ** k) * r["loss"] for k, r in enumerate(res)
                     if r["loss"] is not None]
            if not terms:
                continue
            loss = terms[0]
            for t_ in terms[1:]:
                loss = loss + t_
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            if device.type == "cuda":
                torch.cuda.synchronize()
            stats = []
            for r in res:
                stats.append(float(r["loss"]) if r["loss"] is not None else float("nan"))
            stats += [float(r["rows"]) for r in res]
            stats += [float(r["agree"]) for r in res]
            if any(r["loss"] is not None and not math.isfinite(stats[k])
                   for k, r in enumerate(res)):
                fail("step %d: non-finite loss %s (try a lower --lr)" % (step, stats[:S]))
            if first_loss0 is None:
                first_loss0 = stats[0]
            window.append(stats)
            if len(window) > 50:
                window.pop(0)
            log_acc = stats if log_acc is None else [a + b_ for a, b_ in zip(log_acc, stats)]
            log_acc_n += 1
            tokens_since += res[0]["rows"]
            now = time.time()
            # Time-bounded schedule: the total step count from the measured step time.
            if step == 3:
                t_mark, step_mark = now, step
            if step >= 20 and t_mark is not None and (total is None or step % 100 == 0):
                per = (now - t_mark) / max(1, step - step_mark)
                total = step + int(max(0.0, budget - (now - t0)) / max(per, 1e-6))
                if args.max_steps:
                    total = min(total, args.max_steps)
                if total < 5 * warmup:
                    warmup = max(1, min(warmup, total // 5))
                if step % 100 == 0:
                    t_mark, step_mark = now, step
            if now - last_print >= args.print_every or step == 1:
                n = float(log_acc_n)
                losses = [log_acc[k] / n for k in range(S)]
                rows = [log_acc[S + k] for k in range(S)]
                agree = [log_acc[2 * S + k] / rows[k] if rows[k] else None for k in range(S)]
                log("step %d%s lr %.2e loss %s acc %s %.0f tok/s %.0f s" % (
                    step, "/%d" % total if total else "", lr, fmt(losses), fmt(agree),
                    tokens_since / max(now - last_print, 1e-6), now - t0))
                last_print, tokens_since, log_acc, log_acc_n = now, 0, None, 0
    train_s = time.time() - t0
    if step == 0:
        fail("no training step ran (--minutes %.3f)" % args.minutes)
    final_loss = [sum(w[k] for w in window if w[k] == w[k]) / max(1, sum(1 for w in window
                                                                          if w[k] == w[k]))
                  for k in range(S)]
    final_rows = [sum(w[S + k] for w in window) for k in range(S)]
    final_agree = [sum(w[2 * S + k] for w in window) / final_rows[k] if final_rows[k] else None
                   for k in range(S)]
    log("trained %d steps (%d epochs) in %.1f s; last %d steps: loss %s acc %s"
        % (step, epoch, train_s, len(window), fmt(final_loss), fmt(final_agree)))

    W = cast_weights({k: v.detach() for k, v in P.items()}, prec)
    held_eval = None
    if held:
        held_eval = evaluate(W, embed, d, held, dims, S, rope, prec, vocab, args.batch_seqs,
                             max_tokens)
        for sel in ("all", "response"):
            e = held_eval[sel]
            log("held-out (%s starts): agreement %s chain %s accept length (chain 1..%d) %s"
                % (sel, fmt(e["agreement_per_step"]), fmt(e["chain_agreement_per_step"]), S,
                   fmt(e["predicted_accept_length_chain_1_to_S"], "%.2f")))
    config = draft_config(dims, layers, target, target["max_position_embeddings"])
    export_draft(args.out, P, vocab, config)
    check_export(args.out, target)
    report = {
        "steps": step,
        "epochs": epoch,
        "minutes": train_s / 60.0,
        "ttt_steps": S,
        "step_weights": [STEP_WEIGHT ** k for k in range(S)],
        "first_step_loss_step0": first_loss0,
        "final_loss_per_step": final_loss,
        "final_train_agreement_per_step": final_agree,
        "heldout": held_eval,
        "heldout_sequences": len(held),
        "train_sequences": len(train_ids),
        "tokens": d.total_tokens,
        "captures": d.files,
        "layers": layers,
        "data_token_is_target_argmax": gc,
        "draft": {"hidden": H, "heads": dims.nh, "kv_heads": dims.nkv, "head_dim": dims.hd,
                  "intermediate": dims.I, "draft_vocab": dims.Vd, "vocab": V,
                  "rope_theta": dims.theta, "params": n_params},
        "args": {k: v for k, v in vars(args).items() if k != "self_test"},
        "torch": torch.__version__,
    }
    with open(os.path.join(args.out, "train_report.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    log("wrote %s (config.json, model.safetensors, train_report.json)" % args.out)
    report["_params"] = P
    report["_vocab"] = vocab
    return report


# ---------------------------------------------------------------------------------------------
# Self-test.

def brute_force(P, embed, tok, feat, L, dims, steps):
    """Every entry (i, k) of one sequence, one at a time, in fp64, from an explicit list of the
    entries it sees (forward_cpu.hpp's rules). Returns {(i, k): (h'' [H], logits [Vd])}."""
    Wd = {k: v.detach().to("cpu", torch.float64) for k, v in P.items()}
    E = embed.detach().to("cpu", torch.float64)
    tok = [int(t) for t in tok.tolist()]
    feat = feat.detach().to("cpu", torch.float64)
    nh, nkv, hd, eps, theta = dims.nh, dims.nkv, dims.hd, dims.eps, dims.theta
    group = nh // nkv

    def rms1(x, w):
        return w * (x / math.sqrt(float((x * x).mean()) + eps))

    def rope1(v, pos):
        half = hd // 2
        out = v.clone()
        for j in range(half):
            a = pos * (1.0 / (theta ** (2.0 * j / hd)))
            c, s = math.cos(a), math.sin(a)
            out[j] = v[j] * c - v[j + half] * s
            out[j + half] = v[j + half] * c + v[j] * s
        return out

    def qkv(token, h_in, pos):
        x = torch.cat([rms1(E[token], Wd["midlayer.input_layernorm.weight"]),
                       rms1(h_in, Wd["midlayer.hidden_norm.weight"])])
        q = Wd["midlayer.self_attn.q_proj.weight"] @ x
        k = Wd["midlayer.self_attn.k_proj.weight"] @ x
        v = Wd["midlayer.self_attn.v_proj.weight"] @ x
        q = torch.cat([rope1(q[a * hd:(a + 1) * hd], pos) for a in range(nh)])
        k = torch.cat([rope1(k[g * hd:(g + 1) * hd], pos) for g in range(nkv)])
        return q, k, v

    def finish(h_in, q, visible):
        heads = []
        for a in range(nh):
            g = a // group
            qa = q[a * hd:(a + 1) * hd]
            sc = [float(qa @ kv[0][g * hd:(g + 1) * hd]) / math.sqrt(hd) for kv in visible]
            mx = max(sc)
            ex = [math.exp(s - mx) for s in sc]
            z = sum(ex)
            oa = torch.zeros(hd, dtype=torch.float64)
            for u, kv in enumerate(visible):
                oa = oa + (ex[u] / z) * kv[1][g * hd:(g + 1) * hd]
            heads.append(oa)
        o = torch.cat(heads)
        h1 = h_in + Wd["midlayer.self_attn.o_proj.weight"] @ o
        n1 = rms1(h1, Wd["midlayer.post_attention_layernorm.weight"])
        gt = Wd["midlayer.mlp.gate_proj.weight"] @ n1
        up = Wd["midlayer.mlp.up_proj.weight"] @ n1
        h2 = h1 + Wd["midlayer.mlp.down_proj.weight"] @ (gt * torch.sigmoid(gt) * up)
        logits = Wd["lm_head.weight"] @ rms1(h2, Wd["norm.weight"])
        return h2, logits

    kv, out = {}, {}
    for i in range(L - 1):  # extend entries: token t_{i+1}, fc(f_i), position i
        h0 = Wd["fc.weight"] @ feat[i]
        q, k, v = qkv(tok[i + 1], h0, i)
        kv[(i, 0)] = (k, v)
        visible = [kv[(j, 0)] for j in range(i + 1)]
        out[(i, 0)] = finish(h0, q, visible)
    for k in range(1, steps):  # scratch chains: token t_{i+k+1}, h'' of (i, k-1), position i+k
        for i in range(L - 1 - k):
            h_in = out[(i, k - 1)][0]
            q, kk, vv = qkv(tok[i + k + 1], h_in, i + k)
            kv[(i, k)] = (kk, vv)
            visible = [kv[(j, 0)] for j in range(i + 1)] + [kv[(i, m)] for m in range(1, k + 1)]
            out[(i, k)] = finish(h_in, q, visible)
    return out


def check(cond, msg):
    if not cond:
        fail("self-test: " + msg)


def random_test_params(dims, gen):
    P = {}
    for name, shape in dims.shapes().items():
        if name in NORM_NAMES:
            P[name] = 1.0 + 0.2 * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            fan_in = shape[1]
            P[name] = torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(fan_in)
    return P


def selftest_forward(device):
    """(a) batched TTT == brute force, (b) padding changes nothing, (c) mixed precision close."""
    gen = torch.Generator()
    gen.manual_seed(7)
    dims = Dims(H=32, Fw=96, nh=2, nkv=1, hd=16, I=48, V=64, Vd=64, eps=1e-6, theta=10000.0)
    S, lens_l = 3, [12, 7]
    T = max(lens_l)
    P = {k: v.to(device) for k, v in random_test_params(dims, gen).items()}
    embed = torch.randn(dims.V, dims.H, generator=gen, dtype=torch.float64).to(device)
    tok = torch.randint(0, dims.V, (2, T), generator=gen).to(device)
    feat = torch.randn(2, T, dims.Fw, generator=gen, dtype=torch.float64).to(device)
    lens = torch.tensor(lens_l, dtype=torch.int64, device=device)
    p64 = Prec(torch.float64, torch.float64)
    rope = rope_tables(dims, T + S + 1, device, torch.float64)
    W = cast_weights(P, p64)
    with torch.no_grad():
        outs = ttt_forward(W, embed, tok, feat, lens, dims, S, rope, p64)
    worst_h = worst_l = 0.0
    n_checked = 0
    for b in range(2):
        L = lens_l[b]
        ref = brute_force(P, embed, tok[b, :L], feat[b, :L], L, dims, S)
        for (i, k), (h_ref, l_ref) in ref.items():
            h = outs[k][b, i].cpu()
            with torch.no_grad():
                lg = head_logits(W, outs[k][b, i:i + 1], dims, p64)[0].cpu()
            worst_h = max(worst_h, float((h - h_ref).abs().max()))
            worst_l = max(worst_l, float((lg - l_ref).abs().max()))
            n_checked += 1
    want = sum(max(0, L - 1 - k) for L in lens_l for k in range(S))
    check(n_checked == want, "brute force covered %d entries, expected %d" % (n_checked, want))
    check(worst_h < 1e-9 and worst_l < 1e-9,
          "(a) batched TTT forward vs brute force on %s: max |dh''| %.3e, max |dlogits| %.3e"
          % (device, worst_h, worst_l))
    log("self-test (a) %s: batched TTT == brute force over %d entries (max diff h'' %.1e, "
        "logits %.1e)" % (device, n_checked, worst_h, worst_l))

    # (b) the shorter sequence alone (no padding) against its padded run beside the longer one.
    Ls = lens_l[1]
    with torch.no_grad():
        alone = ttt_forward(W, embed, tok[1:, :Ls], feat[1:, :Ls], lens[1:], dims, S, rope, p64)
        # garbage in the padding must not matter either
        tok_g, feat_g = tok.clone(), feat.clone()
        tok_g[1, Ls:] = (tok_g[1, Ls:] + 5) % dims.V
        feat_g[1, Ls:] = 1e3
        garbage = ttt_forward(W, embed, tok_g, feat_g, lens, dims, S, rope, p64)
    worst = 0.0
    for k in range(S):
        n = Ls - 1 - k
        if n <= 0:
            continue
        worst = max(worst, float((alone[k][0, :n] - outs[k][1, :n]).abs().max()))
        worst = max(worst, float((garbage[k][1, :n] - outs[k][1, :n]).abs().max()))
        worst = max(worst, float((garbage[k][0] - outs[k][0]).abs().max()))
    check(worst < 1e-12, "(b) padding changed the shorter sequence's entries by %.3e" % worst)
    log("self-test (b) %s: padding changes nothing (max diff %.1e)" % (device, worst))

    # Mixed precision (what training runs) stays close to fp64.
    pm = Prec(torch.bfloat16, torch.float32) if device.type == "cuda" else \
        Prec(torch.float32, torch.float32)
    tol = 5e-2 if pm.mm == torch.bfloat16 else 1e-4
    P32 = {k: v.float() for k, v in P.items()}
    Wm = cast_weights(P32, pm)
    rope32 = rope_tables(dims, T + S + 1, device, torch.float32)
    in_dtype = torch.bfloat16 if pm.mm == torch.bfloat16 else torch.float32
    with torch.no_grad():
        mixed = ttt_forward(Wm, embed.to(in_dtype), tok, feat.to(in_dtype), lens, dims, S,
                            rope32, pm)
    worst, scale = 0.0, 0.0
    for k in range(S):
        for b in range(2):
            n = lens_l[b] - 1 - k
            worst = max(worst, float((mixed[k][b, :n].double() - outs[k][b, :n]).abs().max()))
            scale = max(scale, float(outs[k][b, :n].abs().max()))
    # inputs were rounded to bf16 for the mixed run: compare relative to the values' size
    check(worst / scale < tol, "(a') %s / %s forward vs fp64: relative diff %.3e >= %.0e"
          % (pm.mm, pm.acc, worst / scale, tol))
    log("self-test (a') %s: %s matmuls within %.1e relative of fp64 (%.1e)"
        % (device, str(pm.mm).replace("torch.", ""), tol, worst / scale))


def write_synthetic(root, gen, H=32, V=64, layers=(0, 1, 2), n_layers=4, K=4, n_seq=24,
                    files=2):
    """A tiny target (sharded, with an index) and capture files: the target's argmax after
    token t is (5 t + 3) mod V (response rows follow it, prompt rows are random), and the
    feature of row p is a noisy code of the label its extend entry is trained toward (the
    argmax after t_{p+1}), so step 0 is learnable in a few steps."""
    tdir = os.path.join(root, "target")
    os.makedirs(tdir)
    cfg = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
           "hidden_size": H, "vocab_size": V, "num_hidden_layers": n_layers,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
    with open(os.path.join(tdir, "config.json"), "w") as f:
        json.dump(cfg, f)
    a = {"model.embed_tokens.weight": torch.randn(V, H, generator=gen).to(torch.bfloat16)}
    b = {"lm_head.weight": (torch.randn(V, H, generator=gen) * 0.05).to(torch.bfloat16),
         "model.norm.weight": torch.ones(H).to(torch.bfloat16),
         "model.layers.0.mlp.down_proj.weight": torch.zeros(4, 4).to(torch.bfloat16)}
    save_file(a, os.path.join(tdir, "model-00001-of-00002.safetensors"))
    save_file(b, os.path.join(tdir, "model-00002-of-00002.safetensors"))
    wm = {k: "model-00001-of-00002.safetensors" for k in a}
    wm.update({k: "model-00002-of-00002.safetensors" for k in b})
    with open(os.path.join(tdir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)

    def nxt(t):
        return (5 * t + 3) % V

    rng = random.Random(int(torch.randint(0, 1 << 30, (1,), generator=gen)))
    seqs = []
    for s in range(n_seq):
        L = rng.randint(9, 26)
        P = rng.randint(2, 6)
        toks = [rng.randrange(V) for _ in range(P)]
        while len(toks) < L:
            toks.append(nxt(toks[-1]))
        seqs.append((toks, P))
    code = torch.randn(V, len(layers) * H, generator=gen)
    paths = []
    per = (n_seq + files - 1) // files
    for fi in range(files):
        part = seqs[fi * per:(fi + 1) * per]
        ids, starts, plens, tk_ids, tk_lp, feats = [], [0], [], [], [], []
        for toks, P in part:
            for p_ in range(len(toks)):
                lab = nxt(toks[p_ + 1]) if p_ + 1 < len(toks) else rng.randrange(V)
                feats.append(code[lab] + 0.3 * torch.randn(len(layers) * H, generator=gen))
            ids += toks
            starts.append(len(ids))
            plens.append(P)
            for t in toks:
                top = nxt(t)
                others = [x for x in rng.sample(range(V), K + 1) if x != top][:K - 1]
                tk_ids.append([top] + others)
                tk_lp.append([-0.1, -3.0, -3.5, -4.0][:K])
        T = len(ids)
        tens = {
            "input_ids": torch.tensor(ids, dtype=torch.int32),
            "seq_starts": torch.tensor(starts, dtype=torch.int64),
            "prompt_lengths": torch.tensor(plens, dtype=torch.int32),
            "aux_hidden": torch.stack(feats).to(torch.bfloat16),
            "topk_ids": torch.tensor(tk_ids, dtype=torch.int32),
            "topk_logprobs": torch.tensor(tk_lp, dtype=torch.float32),
        }
        meta = {"format": CAPTURE_FORMAT, "layers": ",".join(str(x) for x in layers),
                "hidden_size": str(H), "vocab_size": str(V), "num_hidden_layers": str(n_layers)}
        p = os.path.join(root, "capture-%d.safetensors" % fi)
        save_file(tens, p, metadata=meta)
        paths.append(p)
    # A capture of another layer set: loading it beside the others must fail.
    bad_meta = dict(meta)
    bad_meta["layers"] = "0,1,3"
    bad = os.path.join(root, "capture-bad.safetensors")
    save_file(tens, bad, metadata=bad_meta)
    return tdir, paths, bad


def selftest_pipeline(device, root):
    gen = torch.Generator()
    gen.manual_seed(11)
    sub = os.path.join(root, device.type)
    os.makedirs(sub)
    tdir, caps, bad = write_synthetic(sub, gen)
    # A mismatched capture is refused with a clear message.
    refused = None
    try:
        load_captures(caps + [bad], read_target(tdir), device)
    except TrainError as e:
        refused = str(e)
    check(refused is not None, "a capture with another layer set was accepted")
    check("differ" in refused, "unexpected message for a mismatched capture: %s" % refused)
    for draft_vocab in (0, 40):
        out = os.path.join(sub, "draft-%d" % draft_vocab)
        argv = ["--capture"] + caps + ["--target", tdir, "--out", out, "--ttt-steps", "3",
                                       "--minutes", "5", "--max-steps", "120", "--warmup", "5",
                                       "--batch-seqs", "8", "--lr", "1e-2", "--heads", "2",
                                       "--kv-heads", "1", "--head-dim", "16",
                                       "--intermediate", "48", "--device", str(device),
                                       "--draft-vocab", str(draft_vocab), "--print-every", "5",
                                       "--heldout-frac", "0.1"]
        args = build_parser().parse_args(argv)
        rep = train(args)
        P, vocab = rep["_params"], rep["_vocab"]
        check(rep["steps"] == 120, "expected 120 steps, ran %d" % rep["steps"])
        need = 0.7 if draft_vocab == 0 else 0.9  # a partial vocabulary leaves rows unlearnable
        check(rep["final_loss_per_step"][0] < need * rep["first_step_loss_step0"],
              "loss did not fall: first %.3f, final %s"
              % (rep["first_step_loss_step0"], rep["final_loss_per_step"]))
        # (c) export round-trip: every tensor as written, and the config our loader reads.
        target = read_target(tdir)
        cfg, t = check_export(out, target)
        for name in FLOAT_NAMES:
            check(torch.equal(t[name], P[name].detach().to(torch.bfloat16).cpu()),
                  "(c) %s does not round-trip" % name)
        check(torch.equal(t["d2t"], vocab.d2t.cpu()) and torch.equal(t["t2d"], vocab.t2d.cpu()),
              "(c) d2t / t2d do not round-trip")
        want_vd = 64 if draft_vocab == 0 else draft_vocab
        check(cfg["draft_vocab_size"] == want_vd and cfg["vocab_size"] == 64
              and cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
              and cfg["target_hidden_size"] == 32 and cfg["max_position_embeddings"] == 256,
              "(c) config fields: %s" % cfg)
        with open(os.path.join(out, "train_report.json")) as f:
            r = json.load(f)
        check(r["heldout"] is not None and
              len(r["heldout"]["all"]["predicted_accept_length_chain_1_to_S"]) == 3,
              "(c) train_report.json lacks the held-out accept lengths")
        log("self-test (c) %s, draft vocab %d: trained (loss %.3f -> %.3f), exported, reloaded, "
            "every tensor and config field checked"
            % (device, want_vd, rep["first_step_loss_step0"], rep["final_loss_per_step"][0]))


def self_test():
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    log("self-test: torch %s, devices %s" % (torch.__version__, [str(d) for d in devices]))
    for dev in devices:
        selftest_forward(dev)
    root = tempfile.mkdtemp(prefix="train_eagle3_selftest_")
    try:
        for dev in devices:
            selftest_pipeline(dev, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    log("self-test ok")


# ---------------------------------------------------------------------------------------------

def build_parser():
    ap = argparse.ArgumentParser(description="Train an EAGLE-3 draft on specdec-kimi captures "
                                 "(our engine's draft math; see the module docstring).")
    ap.add_argument("--capture", nargs="+", action="append", default=[],
                    help="capture file(s) (globs allowed; the flag may repeat)")
    ap.add_argument("--target", help="the target checkpoint directory (config.json, safetensors)")
    ap.add_argument("--out", help="output directory of the draft")
    ap.add_argument("--ttt-steps", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=3.5, help="training time budget")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: time)")
    ap.add_argument("--batch-seqs", type=int, default=64)
    ap.add_argument("--max-batch-tokens", type=int, default=0,
                    help="padded tokens per batch (0: bounded by the draft vocabulary size)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--draft-vocab", type=int, default=0,
                    help="draft vocabulary: the N most frequent capture tokens (0: the whole "
                    "target vocabulary)")
    ap.add_argument("--no-init-lm-head", dest="init_lm_head", action="store_false",
                    help="random lm_head instead of the target's rows")
    ap.add_argument("--response-only", action="store_true",
                    help="train only on entries whose start is in the response (i >= prompt - 1)")
    ap.add_argument("--heldout-frac", type=float, default=0.05)
    ap.add_argument("--precision", default="auto", help="auto (bf16 on CUDA), bf16, fp32, fp64")
    ap.add_argument("--print-every", type=float, default=15.0, help="seconds between lines")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--self-test", action="store_true")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if args.self_test:
            self_test()
            return 0
        if not args.capture or not args.target or not args.out:
            fail("--capture, --target and --out are required (or --self-test)")
        train(args)
        return 0
    except TrainError as e:
        sys.stderr.write("train_eagle3.py: error: %s\n" % e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
