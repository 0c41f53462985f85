#!/usr/bin/env python3
"""Trains the demo target: a small Kimi-K2.5 / DeepseekV3-architecture model, exported as a
Hugging Face checkpoint with INT4 routed experts (compressed-tensors pack-quantized) that
specdec-kimi loads.

Runs on the GPU machine (python3 + torch; no network). Tooling only: never part of the library
or the binary.

    python3 tools/demo/train_target.py --data DATA --out CKPT [--minutes 5] [--extra-ids F]...

DATA is what tools/demo/prepare_data.py writes: data/train_ids.bin, data/heldout_ids.bin (uint16
token ids, documents separated by [EOS]), data/meta.json and tokenizer/ (tiktoken.model and
tokenizer_config.json, copied into CKPT so the checkpoint serves text). --extra-ids adds more
training text in the same format after train_ids.bin (prepare_data.py --extra-train-fraction
writes data/extra_train_ids.bin: Python files beyond the standard library, so the target
memorises less of its training files); the held-out set stays data/heldout_ids.bin.

The model is the architecture of ../shared/reference/kimi.md, written out here in plain torch
(transformers' own module is not used for training: its expert layout changes between versions;
scripts/hf_parity.py checks the exported checkpoint against transformers instead):
  pre-norm layers, layer 0 a dense SwiGLU MLP, layers >= 1 MoE (sigmoid router with a selection
  bias, top-k, weights renormalised and scaled, plus one shared expert); MLA attention with
  interleaved (GPT-J pair) RoPE on the rope parts of q and of the shared k_rope; RMSNorm in fp32.
Routing is balanced without an auxiliary loss: after each step the selection bias
(e_score_correction_bias) moves by --bias-rate towards the experts that got fewer tokens.
For the last --qat-fraction of the steps the routed experts train through their INT4 rounding
(group 32, symmetric, bf16 scales: exactly what the export writes), with a straight-through
gradient, so the exported INT4 model is the model that was trained.

CKPT gets config.json, model.safetensors (bf16; e_score_correction_bias fp32; experts INT4 as
weight_packed int32 [out, in/8], weight_scale bf16 [out, in/32], weight_shape int32 [2]: values
in [-8, 7] offset by +8, eight along the input dimension per int32, least significant nibble
first), the tokenizer files, and train_report.json (steps, losses, held-out loss of the bf16
weights and of the exported INT4 weights, samples).
"""

import argparse
import base64
import json
import math
import os
import shutil
import sys
import time

import torch
import torch.nn.functional as F

GROUP = 32  # INT4 group size along the input dimension


def fail(msg):
    print("train_target: error: " + msg, file=sys.stderr)
    sys.exit(2)


# ----------------------------------------------------------------------------------------------
# INT4 (compressed-tensors pack-quantized, symmetric, group 32)


def int4_quantize(w):
    """w [..., out, in] float -> (q int8 in [-8, 7], scale bf16 [..., out, in/32])."""
    g = w.float().reshape(*w.shape[:-1], w.shape[-1] // GROUP, GROUP)
    amax = g.abs().amax(dim=-1).clamp_min(1e-8)
    scale = (amax / 7.5).to(torch.bfloat16)  # compressed-tensors: max / ((q_max - q_min) / 2)
    q = torch.clamp(torch.round(g / scale.float().unsqueeze(-1)), -8, 7).to(torch.int8)
    return q.reshape(w.shape), scale


def int4_dequantize(q, scale):
    g = q.float().reshape(*q.shape[:-1], q.shape[-1] // GROUP, GROUP)
    return (g * scale.float().unsqueeze(-1)).reshape(q.shape)


def int4_fake(w):
    """w rounded through INT4 and back, with the straight-through gradient."""
    q, s = int4_quantize(w.detach())
    return w + (int4_dequantize(q, s).to(w.dtype) - w).detach()


def int4_pack(q):
    """q int8 [out, in] in [-8, 7] -> int32 [out, in/8], element k+i in bits 4i..4i+3."""
    u = (q.to(torch.int64) + 8).reshape(q.shape[0], q.shape[1] // 8, 8)
    word = torch.zeros(u.shape[:2], dtype=torch.int64, device=q.device)
    for i in range(8):
        word |= u[:, :, i] << (4 * i)
    word = torch.where(word >= 2**31, word - 2**32, word)  # two's complement int32
    return word.to(torch.int32)


# ----------------------------------------------------------------------------------------------
# The model


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rope_interleaved(x, cos, sin):
    """x [..., T, d]: pairs (2i, 2i+1) rotated by angle position * inv_freq[i]."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    return torch.stack((y1, y2), dim=-1).flatten(-2)


class Mla(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        H, nh = c["hidden_size"], c["num_attention_heads"]
        self.nh, self.nope, self.rope = nh, c["qk_nope_head_dim"], c["qk_rope_head_dim"]
        self.vd, self.r = c["v_head_dim"], c["kv_lora_rank"]
        self.q_a_proj = torch.nn.Linear(H, c["q_lora_rank"], bias=False)
        self.q_a_layernorm = RMSNorm(c["q_lora_rank"], c["rms_norm_eps"])
        self.q_b_proj = torch.nn.Linear(c["q_lora_rank"], nh * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = torch.nn.Linear(H, self.r + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.r, c["rms_norm_eps"])
        self.kv_b_proj = torch.nn.Linear(self.r, nh * (self.nope + self.vd), bias=False)
        self.o_proj = torch.nn.Linear(nh * self.vd, H, bias=False)
        self.scale = (self.nope + self.rope) ** -0.5

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, self.nh, self.nope + self.rope).transpose(1, 2)
        q_nope, q_rope = q[..., : self.nope], q[..., self.nope:]
        ckv = self.kv_a_proj_with_mqa(x)
        c_kv, k_rope = ckv[..., : self.r], ckv[..., self.r:]
        kv = self.kv_b_proj(self.kv_a_layernorm(c_kv))
        kv = kv.view(B, T, self.nh, self.nope + self.vd).transpose(1, 2)
        k_nope, v = kv[..., : self.nope], kv[..., self.nope:]
        q_rope = rope_interleaved(q_rope, cos, sin)
        k_rope = rope_interleaved(k_rope.unsqueeze(1), cos, sin).expand(B, self.nh, T, self.rope)
        qq = torch.cat((q_nope, q_rope), -1)
        kk = torch.cat((k_nope, k_rope), -1)
        o = F.scaled_dot_product_attention(qq, kk, v, is_causal=True, scale=self.scale)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.vd))


class DenseMlp(torch.nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.gate_proj = torch.nn.Linear(H, I, bias=False)
        self.up_proj = torch.nn.Linear(H, I, bias=False)
        self.down_proj = torch.nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Moe(torch.nn.Module):
    """Routed experts held as [E, out, in] tensors (exported one Linear per expert)."""

    def __init__(self, c):
        super().__init__()
        H, I, E = c["hidden_size"], c["moe_intermediate_size"], c["n_routed_experts"]
        self.E, self.k = E, c["num_experts_per_tok"]
        self.scaling, self.norm_topk = c["routed_scaling_factor"], c["norm_topk_prob"]
        self.gate_weight = torch.nn.Parameter(torch.empty(E, H))
        self.register_buffer("e_score_correction_bias", torch.zeros(E))
        self.w_gate = torch.nn.Parameter(torch.empty(E, I, H))
        self.w_up = torch.nn.Parameter(torch.empty(E, I, H))
        self.w_down = torch.nn.Parameter(torch.empty(E, H, I))
        self.shared_experts = DenseMlp(H, I * c["n_shared_experts"])
        self.int4 = False
        self.last_load = None

    def experts(self):
        w = (self.w_gate, self.w_up, self.w_down)
        return tuple(int4_fake(t) for t in w) if self.int4 else w

    def forward(self, x):
        shape = x.shape
        xf = x.reshape(-1, shape[-1])
        with torch.autocast(x.device.type, enabled=False):  # the router is fp32 (kimi.md)
            s = torch.sigmoid(xf.float() @ self.gate_weight.float().t())  # [N, E]
            _, idx = torch.topk(s + self.e_score_correction_bias, self.k, dim=-1)
            w = torch.gather(s, 1, idx)
            if self.norm_topk:
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
            w = w * self.scaling
            dense = torch.zeros_like(s).scatter(1, idx, w)  # [N, E] fp32
        with torch.no_grad():
            self.last_load = torch.zeros(self.E, device=x.device).index_add_(
                0, idx.flatten(), torch.ones(idx.numel(), device=x.device))
        wg, wu, wd = self.experts()
        xe = xf.to(wg.dtype) if not torch.is_autocast_enabled() else xf
        h = F.silu(torch.einsum("nh,eih->eni", xe, wg)) * torch.einsum("nh,eih->eni", xe, wu)
        y = torch.einsum("eni,ehi->enh", h, wd)  # [E, N, H]
        routed = torch.einsum("enh,ne->nh", y.float(), dense).to(x.dtype)
        return routed.reshape(shape) + self.shared_experts(x)


class Layer(torch.nn.Module):
    def __init__(self, c, dense):
        super().__init__()
        H = c["hidden_size"]
        self.input_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.self_attn = Mla(c)
        self.post_attention_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.mlp = DenseMlp(H, c["intermediate_size"]) if dense else Moe(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = torch.nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = torch.nn.ModuleList(
            [Layer(c, i < c["first_k_dense_replace"]) for i in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = torch.nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        d = c["qk_rope_head_dim"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        self.register_buffer("inv_freq", inv.float(), persistent=False)
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                torch.nn.init.normal_(p, std=0.02)
        for layer in self.layers:  # residual branches start small
            torch.nn.init.normal_(layer.self_attn.o_proj.weight, std=0.02 / math.sqrt(
                2 * c["num_hidden_layers"]))

    def moe_layers(self):
        return [l.mlp for l in self.layers if isinstance(l.mlp, Moe)]

    def forward(self, ids):
        T = ids.shape[1]
        pos = torch.arange(T, device=ids.device, dtype=torch.float32)
        ang = pos[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cos(ang), torch.sin(ang)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def demo_config(a, meta):
    V = meta["vocab_size"]
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "attention_bias": False,
        "bos_token_id": meta["bos_id"],
        "eos_token_id": meta["eos_id"],
        "pad_token_id": meta["pad_id"],
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "kv_lora_rank": a.kv_lora_rank,
        "max_position_embeddings": a.max_positions,
        "moe_intermediate_size": a.moe_intermediate,
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": a.experts,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": a.heads,
        "num_experts_per_tok": a.experts_per_token,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.heads,
        "q_lora_rank": a.q_lora_rank,
        "qk_nope_head_dim": a.nope,
        "qk_rope_head_dim": a.rope,
        "v_head_dim": a.nope,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "rope_interleave": True,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "vocab_size": V,
        "quantization_config": {
            "config_groups": {"group_0": {
                "input_activations": None, "output_activations": None, "targets": ["Linear"],
                "weights": {"actorder": None, "dynamic": False, "group_size": GROUP,
                            "num_bits": 4, "observer": "minmax", "observer_kwargs": {},
                            "strategy": "group", "symmetric": True, "type": "int"}}},
            "format": "pack-quantized",
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                       "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
            "kv_cache_scheme": None,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
        },
    }


# ----------------------------------------------------------------------------------------------
# Data


def load_ids(path):
    if not os.path.isfile(path):
        fail("%s: no such file (uint16 token ids expected)" % path)
    raw = open(path, "rb").read()
    if len(raw) % 2:
        fail("%s: odd byte count %d (expected uint16 ids)" % (path, len(raw)))
    t = torch.frombuffer(bytearray(raw), dtype=torch.int16).to(torch.int64) & 0xFFFF
    return t


def batches(ids, T, B, gen, device):
    n = ids.numel() - T - 1
    while True:
        starts = torch.randint(0, n, (B,), generator=gen)
        x = torch.stack([ids[s: s + T + 1] for s in starts.tolist()]).to(device)
        yield x[:, :-1], x[:, 1:]


@torch.no_grad()
def heldout_loss(model, ids, T, device, max_windows=64):
    model.eval()
    total, count = 0.0, 0
    n = (ids.numel() - 1) // T
    for w in range(min(n, max_windows)):
        x = ids[w * T: w * T + T + 1].to(device)[None]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = model(x[:, :-1])
        total += F.cross_entropy(logits.float().flatten(0, 1), x[0, 1:], reduction="sum").item()
        count += T
    model.train()
    return total / max(count, 1)


class Vocab:
    def __init__(self, tok_dir):
        self.bytes = {}
        for line in open(os.path.join(tok_dir, "tiktoken.model"), "rb"):
            line = line.strip()
            if line:
                b64, rank = line.split()
                self.bytes[int(rank)] = base64.b64decode(b64)
        cfg = json.load(open(os.path.join(tok_dir, "tokenizer_config.json")))
        for sid, tok in cfg.get("added_tokens_decoder", {}).items():
            self.bytes[int(sid)] = tok["content"].encode()

    def decode(self, ids):
        return b"".join(self.bytes.get(i, b"?") for i in ids).decode("utf-8", "replace")


@torch.no_grad()
def greedy(model, prompt, n, device):
    model.eval()
    ids = torch.tensor([prompt], device=device)
    out = []
    for _ in range(n):
        logits = model(ids)[0, -1].float()
        nxt = int(torch.argmax(logits).item())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]], device=device)], 1)
    model.train()
    return out


# ----------------------------------------------------------------------------------------------
# Export


def export(model, c, out_dir, tok_dir):
    sd = {}
    bf = lambda t: t.detach().to(torch.bfloat16).contiguous().cpu()
    sd["model.embed_tokens.weight"] = bf(model.embed_tokens.weight)
    sd["model.norm.weight"] = bf(model.norm.weight)
    sd["lm_head.weight"] = bf(model.lm_head.weight)
    for i, layer in enumerate(model.layers):
        p = "model.layers.%d." % i
        sd[p + "input_layernorm.weight"] = bf(layer.input_layernorm.weight)
        sd[p + "post_attention_layernorm.weight"] = bf(layer.post_attention_layernorm.weight)
        a = layer.self_attn
        for name in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
            sd[p + "self_attn.%s.weight" % name] = bf(getattr(a, name).weight)
        sd[p + "self_attn.q_a_layernorm.weight"] = bf(a.q_a_layernorm.weight)
        sd[p + "self_attn.kv_a_layernorm.weight"] = bf(a.kv_a_layernorm.weight)
        m = layer.mlp
        if isinstance(m, DenseMlp):
            for name in ("gate_proj", "up_proj", "down_proj"):
                sd[p + "mlp.%s.weight" % name] = bf(getattr(m, name).weight)
            continue
        sd[p + "mlp.gate.weight"] = bf(m.gate_weight)
        sd[p + "mlp.gate.e_score_correction_bias"] = (
            m.e_score_correction_bias.detach().float().contiguous().cpu())
        for name in ("gate_proj", "up_proj", "down_proj"):
            sd[p + "mlp.shared_experts.%s.weight" % name] = bf(getattr(m.shared_experts, name).weight)
        for name, w in (("gate_proj", m.w_gate), ("up_proj", m.w_up), ("down_proj", m.w_down)):
            for e in range(m.E):
                q, s = int4_quantize(w[e].detach())
                base = p + "mlp.experts.%d.%s." % (e, name)
                sd[base + "weight_packed"] = int4_pack(q).contiguous().cpu()
                sd[base + "weight_scale"] = s.contiguous().cpu()
                sd[base + "weight_shape"] = torch.tensor(list(w[e].shape), dtype=torch.int32)
    os.makedirs(out_dir, exist_ok=True)
    from safetensors.torch import save_file
    save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")
    for name in ("tiktoken.model", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, name), os.path.join(out_dir, name))
    return sum(t.numel() * t.element_size() for t in sd.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--extra-ids", action="append", default=[],
                    help="more training ids (uint16, as train_ids.bin), appended (repeatable)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--qat-fraction", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--q-lora-rank", type=int, default=128)
    ap.add_argument("--kv-lora-rank", type=int, default=64)
    ap.add_argument("--nope", type=int, default=32)
    ap.add_argument("--rope", type=int, default=16)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--moe-intermediate", type=int, default=256)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--experts-per-token", type=int, default=2)
    ap.add_argument("--max-positions", type=int, default=2048)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    meta = json.load(open(os.path.join(a.data, "data", "meta.json")))
    try:
        ids = meta["special_ids"]
        meta.update(bos_id=ids["bos"], eos_id=ids["eos"], pad_id=ids["pad"])
        meta["vocab_size"] = int(meta["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        fail("%s/data/meta.json: no vocab_size / special_ids.{bos,eos,pad} (%r)" % (a.data, e))
    if os.path.exists(a.out) and os.listdir(a.out):
        fail("--out %s exists and is not empty" % a.out)
    tok_dir = os.path.join(a.data, "tokenizer")
    train = load_ids(os.path.join(a.data, "data", "train_ids.bin"))
    if a.extra_ids:
        train = torch.cat([train] + [load_ids(path) for path in a.extra_ids])
    held = load_ids(os.path.join(a.data, "data", "heldout_ids.bin"))
    if int(train.max()) >= meta["vocab_size"]:
        fail("train ids reach %d, vocabulary is %d" % (int(train.max()), meta["vocab_size"]))
    c = demo_config(a, meta)
    torch.manual_seed(a.seed)
    dev = a.device
    model = Model(c).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print("train_target: %d parameters, %d train / %d held-out tokens, device %s" %
          (n_params, train.numel(), held.numel(), dev), flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(a.seed)
    data = batches(train, a.seq_len, a.batch, gen, dev)
    budget = a.minutes * 60.0
    warmup, step, total_steps = 100, 0, None
    t0 = time.time()
    last_print = t0
    losses = []
    while True:
        elapsed = time.time() - t0
        # Plan the cosine schedule's length from the pace: first over steps 0..30, then again
        # over steps 30..130, after the first steps' compilation and allocation are paid.
        if step == 30:
            t30 = elapsed
            total_steps = max(int(budget / (elapsed / 30.0)), 200)
            print("train_target: %.1f ms/step, planning %d steps" %
                  (1000 * elapsed / 30, total_steps), flush=True)
        if step == 130:
            per_step = (elapsed - t30) / 100.0
            total_steps = max(step + int((budget - elapsed) / per_step), 200)
            print("train_target: %.1f ms/step over steps 30..130, planning %d steps" %
                  (1000 * per_step, total_steps), flush=True)
        if total_steps is not None and step >= total_steps:
            break
        if total_steps is not None:
            frac = min(step / total_steps, 1.0)
            for m in model.moe_layers():
                m.int4 = frac >= 1.0 - a.qat_fraction
            lr = a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        else:
            lr = a.lr
        lr = lr * min(1.0, (step + 1) / warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = next(data)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev == "cuda"):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing of the routed experts
            for m in model.moe_layers():
                load = m.last_load
                m.e_score_correction_bias += a.bias_rate * torch.sign(load.mean() - load)
        step += 1
        if not math.isfinite(loss.item()):
            fail("loss is %r at step %d" % (loss.item(), step))
        losses.append(loss.item())
        if time.time() - last_print > 30:
            last_print = time.time()
            loads = [m.last_load.tolist() for m in model.moe_layers()]
            print("step %d/%s loss %.4f held-out %.4f lr %.2e int4 %s load L1 %s" % (
                step, total_steps, sum(losses[-20:]) / len(losses[-20:]),
                heldout_loss(model, held, a.seq_len, dev, max_windows=8), lr,
                model.moe_layers()[0].int4, [int(v) for v in loads[0]]), flush=True)

    minutes = (time.time() - t0) / 60
    for m in model.moe_layers():
        m.int4 = False
    loss_bf16 = heldout_loss(model, held, a.seq_len, dev)
    for m in model.moe_layers():
        m.int4 = True
    loss_int4 = heldout_loss(model, held, a.seq_len, dev)
    print("train_target: %d steps in %.2f min; held-out loss %.4f (trained weights), %.4f "
          "(INT4 experts)" % (step, minutes, loss_bf16, loss_int4), flush=True)

    vocab = Vocab(tok_dir)
    samples = []
    prompts = [line for line in open(os.path.join(a.data, "data", "prompts_heldout.jsonl"))][:4]
    for line in prompts:
        p = json.loads(line)["input_ids"][:48]
        out = greedy(model, p, 64, dev)
        samples.append({"prompt": vocab.decode(p), "continuation": vocab.decode(out),
                        "prompt_ids": p, "greedy_ids": out})
        print("--- prompt:\n%s\n--- greedy:\n%s" % (samples[-1]["prompt"],
                                                   samples[-1]["continuation"]), flush=True)
    nbytes = export(model, c, a.out, tok_dir)
    report = {"steps": step, "minutes": minutes, "parameters": n_params,
              "seq_len": a.seq_len, "batch": a.batch, "train_tokens": int(train.numel()),
              "extra_ids": a.extra_ids,
              "final_train_loss": sum(losses[-50:]) / len(losses[-50:]),
              "heldout_loss_trained_weights": loss_bf16, "heldout_loss_int4_experts": loss_int4,
              "checkpoint_bytes": nbytes, "samples": samples, "args": vars(a)}
    with open(os.path.join(a.out, "train_report.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("train_target: wrote %s (%.2f MB of tensors)" % (a.out, nbytes / 1e6), flush=True)


if __name__ == "__main__":
    main()
