#!/usr/bin/env python3
"""Real KV, not synthetic bytes: a real model's KV cache through Fluxon's hostless path.

Per model (a Llama-3-8B-shaped GQA model and a DeepSeek-V2-Lite-shaped MLA model, built from a
config with seeded random weights -- no download) and per value layout (page_first, layer_first):

  1. prefill a seeded random prompt, put its per-layer KV into a token-major KV pool
     ``[token_slot][item]`` (SGLang's pool; the prompt's pages scattered over the pool) and back it
     up page by page (64 tokens a page) through Fluxon: ``local_fast_put_start`` -> backup copy
     (GPU: ``GpuCopier.write_pages_to_values``; CPU: ``copy_pages_cpu("backup")``) ->
     ``local_fast_put_commit(...).result()``, against a real ``fluxon master`` + ``fluxon owner``
     started by this script;
  2. a second request shares the prefix: ``get_start`` -> ``get_transfer`` -> restore into a fresh
     pool (GPU: layer by layer on a side stream, one CUDA event per layer, decoder layer i waiting on
     event i in a forward pre-hook, the way SGLang's layer-wise load-back overlaps compute; CPU:
     ``copy_pages_cpu("restore", layer=i)`` in the same hook) -> ``release_views``; the model's cache is
     built from views of the restored pool and the continuation runs;
  3. checks: the restored bytes equal the backed-up pages, the continuation's logits equal (bit for
     bit) those from the original in-memory prefill KV, and equal a full recompute (prefix +
     continuation in one forward) within a tolerance -- not bit for bit, because the recompute runs
     different matmul and attention shapes, which reorder the float sums; a control (another prompt's
     KV) must miss that tolerance, or the tolerance could not see a wrong cache (reordered pages are no
     control: with RoPE already in K, attention over the cache does not depend on the keys' order);
  4. GPU only: time to first token, restore (get_start + get_transfer + overlapped restore +
     continuation) against recompute (full prefill), medians in the same run; restore GB/s against a
     contiguous host-to-device copy of the same bytes (from pinned memory and from the registered
     Fluxon segment), measured in the same run.

Without ``transformers`` (the CPU CI) the GQA model is a small Llama-style decoder written below in
plain torch, and the output says so; the MLA model then is absent.

  python3 tools/real_kv.py                      # GPU: Llama-3-8B and DeepSeek-V2-Lite shapes, 4K and 16K
  python3 tools/real_kv.py --device cpu         # CPU reference copies, small model, a few pages
Exit status 0 only when every check of every case passed.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import ctypes
import hashlib
import importlib
import json
import math
import os
import random
import signal
import statistics
import sys
import time
from pathlib import Path

PAGE = 64  # tokens per page: SGLang's HiCache page size
ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}
# logits_vs_recompute: relative L2 error allowed between the cached continuation and a full recompute.
# Measured on the in-script model (bf16, hidden 256, 1K prefix): 0.9% at 4 layers, 2.6% at 16, 4.2% at
# 32 -- rounding noise grows with depth -- and on the H200 (2026-12-01, bf16): Llama-3-8B shape 4.1%
# (4K) / 3.9% (16K), DeepSeek-V2-Lite shape 3.3% / 3.5%; a wrong cache gives O(1) (uncorrelated
# logits: 1.2-1.4). The bound sits at 2.5x the largest seen. An MoE model (the MLA one) gets 1.5x on
# top: a rounding difference can flip a token's expert choice, a discrete change dense models lack.
TOLERANCE = {"float32": 1e-4, "bfloat16": 0.1, "float16": 0.1}
MOE_TOLERANCE_FACTOR = 1.5


T0 = time.perf_counter()


def log(msg: str) -> None:
    print(msg, flush=True)


def device_ctx(torch, device):
    """Build parameters directly on the GPU where torch can (2.0+): no 8B-parameter init on the CPU."""
    if device == "cuda":
        d = torch.device(device)
        if hasattr(d, "__enter__"):
            return d
    return contextlib.nullcontext()


def parse_size(s: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "k": 1 << 10, "m": 1 << 20,
             "g": 1 << 30}
    t = s.strip().lower()
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u):
            return int(float(t[:-len(u)]) * units[u])
    return int(t)


def fmt_bytes(n: float) -> str:
    for u, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m:
            return f"{n / m:.2f} {u}"
    return f"{int(n)} B"


def import_fluxon():
    """The fluxon package from PYTHONPATH, else the build's (FLUXON_BUILD_DIR or build/)."""
    try:
        importlib.import_module("fluxon")
    except ImportError:
        build = Path(os.environ.get("FLUXON_BUILD_DIR", ROOT / "build"))
        sys.path.insert(0, str(build / "python"))
    importlib.import_module("fluxon.kv")
    return importlib.import_module("fluxon")


# The daemons: one master + one owner, as `fluxon cluster up` starts them (fluxon.testing.LocalCluster).

def daemons_of(dram: int, grant: int):
    from fluxon.testing import LocalCluster
    mib = 1 << 20
    return LocalCluster({"owners": [{"contribute_to_cluster_pool_size": {"dram": f"{dram // mib}MiB"},
                                     "local_reserve_grant_bytes": f"{grant // mib}MiB",
                                     "eviction_free_watermark": 0}]},
                        name=f"realkv{os.getpid()}")


# --------------------------------------------------------------------------------------------
# Models: Hugging Face ones from a config (random weights), or the in-script fallback.

SHAPES = {
    # (name shown, config kwargs). init_range is set from hidden_size below.
    ("gqa", "full"): ("Llama-3-8B shape", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    ("gqa", "tiny"): ("tiny Llama-style", dict(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    ("qwen2", "full"): ("Qwen2.5-7B shape", dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    ("qwen2", "tiny"): ("tiny Qwen2-style", dict(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    ("mla", "full"): ("DeepSeek-V2-Lite shape", dict(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, num_hidden_layers=27, num_attention_heads=16,
        num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, moe_intermediate_size=1408,
        first_k_dense_replace=1, topk_method="greedy", routed_scaling_factor=1.0, tie_word_embeddings=False)),
    ("mla", "tiny"): ("tiny DeepSeek-V2-style", dict(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, kv_lora_rank=64, q_lora_rank=None, qk_nope_head_dim=32, qk_rope_head_dim=16,
        v_head_dim=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=128,
        first_k_dense_replace=1, topk_method="greedy", routed_scaling_factor=1.0, tie_word_embeddings=False)),
}
CONFIG_CLASS = {"gqa": "LlamaConfig", "qwen2": "Qwen2Config", "mla": "DeepseekV2Config"}


def init_range(hidden: int) -> float:
    # Weights of std sqrt(2/hidden) give attention logits of std ~2 after RMSNorm: attention that
    # depends on which keys sit where, so that a misplaced page changes the logits (the control).
    return math.sqrt(2.0 / hidden)


class Model:
    """What the script needs of a model: its decoder layers (for the pre-hooks), a cache with
    ``update(k, v, layer)``, the per-layer KV of a filled cache, and logits of the last tokens."""

    def __init__(self, torch, kind, desc, module, layers, lm_head_of, base, new_cache, extract, vocab):
        self.torch, self.kind, self.desc = torch, kind, desc
        self.module, self.layers, self._head, self._base = module, layers, lm_head_of, base
        self.new_cache, self.extract, self.vocab = new_cache, extract, vocab

    def logits(self, ids, cache, last: int):
        """float32 logits [last, vocab] of the last `last` positions; `cache` is filled as a server's would be."""
        h = self._base(ids, cache)
        return self._head(h[:, -last:, :])[0].float()


def build_hf_model(torch, kind, shape, dtype, device, seed):
    import transformers
    cls_name = CONFIG_CLASS[kind]
    cfg_cls = getattr(transformers, cls_name, None)
    if cfg_cls is None:
        return None, f"transformers {transformers.__version__} has no {cls_name}"
    name, kw = SHAPES[(kind, shape)]
    kw = dict(kw, initializer_range=init_range(kw["hidden_size"]), max_position_embeddings=32768)
    cfg = cfg_cls(**kw)
    torch.manual_seed(seed)
    with device_ctx(torch, device):
        try:
            hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        except TypeError:
            hf = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
    hf = hf.to(device=device, dtype=dtype).eval()
    base = hf.base_model
    head = hf.get_output_embeddings()

    def run_base(ids, cache):
        out = base(input_ids=ids, past_key_values=cache, use_cache=True)
        return out[0]

    def new_cache():
        return transformers.DynamicCache()

    def extract(cache):
        n = len(base.layers)
        if hasattr(cache, "layers") and len(cache.layers) and hasattr(cache.layers[0], "keys"):
            return [(cache.layers[i].keys, cache.layers[i].values) for i in range(n)]
        if hasattr(cache, "key_cache"):
            return [(cache.key_cache[i], cache.value_cache[i]) for i in range(n)]
        return [(cache[i][0], cache[i][1]) for i in range(n)]

    desc = (f"{kind}: {name}, transformers {transformers.__version__} {type(hf).__name__} from "
            f"{cls_name} (random weights, seed {seed})")
    return Model(torch, kind, desc, hf, list(base.layers), head, run_base, new_cache, extract,
                 cfg.vocab_size), None


class TinyCache:
    """The cache of the in-script model: per layer K and V [1, kv_heads, seq, head_dim], grown by
    ``update`` like transformers' DynamicCache."""

    def __init__(self):
        self.k, self.v = [], []

    def update(self, k, v, layer, *_):
        import torch
        if layer == len(self.k):
            self.k.append(k)
            self.v.append(v)
        elif layer < len(self.k):
            self.k[layer] = torch.cat([self.k[layer], k], dim=-2)
            self.v[layer] = torch.cat([self.v[layer], v], dim=-2)
        else:
            raise RuntimeError(f"TinyCache: layer {layer} updated before layer {len(self.k)}")
        return self.k[layer], self.v[layer]

    def get_seq_length(self, layer=0):
        return self.k[layer].shape[-2] if len(self.k) > layer else 0


def build_tiny_model(torch, shape, dtype, device, seed):
    """A small Llama-style GQA decoder in plain torch (RMSNorm, RoPE, grouped-query attention with a
    KV cache, SwiGLU MLP): the model of a machine without transformers."""
    nn = torch.nn
    _, cfg = SHAPES[("gqa", shape)]
    H, L, NH, KVH = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, FF, V, eps = H // NH, cfg["intermediate_size"], cfg["vocab_size"], cfg["rms_norm_eps"]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * self.weight

    def rope(x, pos):
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D))
        f = pos.float()[:, None] * inv[None, :]
        emb = torch.cat([f, f], dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    class Layer(nn.Module):
        def __init__(self, idx):
            super().__init__()
            self.idx = idx
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.q, self.k = nn.Linear(H, NH * D, bias=False), nn.Linear(H, KVH * D, bias=False)
            self.v, self.o = nn.Linear(H, KVH * D, bias=False), nn.Linear(NH * D, H, bias=False)
            self.gate, self.up = nn.Linear(H, FF, bias=False), nn.Linear(H, FF, bias=False)
            self.down = nn.Linear(FF, H, bias=False)

        def forward(self, x, cache, pos):
            B, T, _ = x.shape
            h = self.n1(x)
            q = rope(self.q(h).view(B, T, NH, D).transpose(1, 2), pos)
            k = rope(self.k(h).view(B, T, KVH, D).transpose(1, 2), pos)
            v = self.v(h).view(B, T, KVH, D).transpose(1, 2)
            k, v = cache.update(k, v, self.idx)
            k, v = k.repeat_interleave(NH // KVH, dim=1), v.repeat_interleave(NH // KVH, dim=1)
            S = k.shape[-2]
            mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=S - T)
            sdpa = getattr(nn.functional, "scaled_dot_product_attention", None)
            if sdpa is not None:  # torch 2: a fused kernel (the GPU run of --no-transformers)
                o = sdpa(q, k, v, is_causal=True) if S == T else sdpa(q, k, v, attn_mask=mask)
            else:
                scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(D)
                o = scores.masked_fill(~mask, float("-inf")).softmax(-1).to(v.dtype) @ v
            x = x + self.o(o.transpose(1, 2).reshape(B, T, NH * D))
            h = self.n2(x)
            return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(V, H)
            self.layers = nn.ModuleList([Layer(i) for i in range(L)])
            self.norm = RMSNorm()
            self.lm_head = nn.Linear(H, V, bias=False)

        def forward(self, ids, cache):
            past = cache.get_seq_length()
            pos = torch.arange(past, past + ids.shape[1], device=ids.device)
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x, cache, pos)
            return self.norm(x)

    torch.manual_seed(seed)
    with device_ctx(torch, device):
        m = Tiny()
    std = init_range(H)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                mod.weight.normal_(0.0, std)
    m = m.to(device=device, dtype=dtype).eval()

    def extract(cache):
        return list(zip(cache.k, cache.v))

    desc = (f"gqa: in-script Llama-style GQA decoder in plain torch ({L} layers, hidden {H}, {NH} heads, "
            f"{KVH} KV heads; transformers is not installed here; random weights, seed {seed})")
    return Model(torch, "gqa", desc, m, list(m.layers), m.lm_head, m, TinyCache, extract, V)


# --------------------------------------------------------------------------------------------
# KV pools and the copies between them and Fluxon values.

class KvPool:
    """Per layer a K and a V buffer [token_slot][item] (one uint8 tensor [layers, slots, item] each),
    SGLang's token-major pool. item = heads * dim * dtype_size; a K/V pair of unequal head dims (an
    MLA cache: the latent c_kv/k_pe, or decompressed K/V) is stored at the larger one, the smaller
    padded with zeros."""

    def __init__(self, torch, layers, pages, heads, dim, dtype, device):
        self.torch, self.layers, self.pages, self.heads, self.dim, self.dtype = torch, layers, pages, heads, dim, dtype
        esize = torch.empty(0, dtype=dtype).element_size()
        self.esize = esize
        self.item = heads * dim * esize
        self.k = torch.zeros(layers, pages * PAGE, self.item, dtype=torch.uint8, device=device)
        self.v = torch.zeros(layers, pages * PAGE, self.item, dtype=torch.uint8, device=device)

    def typed(self, buf, layer):  # [slots, heads, dim] in the model dtype, aliasing the bytes
        return buf[layer].view(self.dtype).view(self.pages * PAGE, self.heads, self.dim)

    def ptrs(self):
        return [self.k[i].data_ptr() for i in range(self.layers)], [self.v[i].data_ptr() for i in range(self.layers)]

    def store(self, layer, k, v, page_idx):
        """The prefill's [1, heads, seq, dim] K and V -> this pool's pages page_idx (a scatter)."""
        n = len(page_idx)
        idx = self.torch.tensor(page_idx, dtype=self.torch.long, device=self.k.device)
        for buf, t in ((self.k, k), (self.v, v)):
            dst = self.typed(buf, layer).view(self.pages, PAGE, self.heads, self.dim)
            src = t[0].transpose(0, 1).reshape(n, PAGE, self.heads, t.shape[-1])
            dst[idx, :, :, :t.shape[-1]] = src

    def view(self, layer, seq, kdim, vdim):
        """[1, heads, seq, dim] views of pages 0.. of this pool: the model's cache, no copy."""
        k = self.typed(self.k, layer)[:seq, :, :kdim].permute(1, 0, 2).unsqueeze(0)
        v = self.typed(self.v, layer)[:seq, :, :vdim].permute(1, 0, 2).unsqueeze(0)
        return k, v

    def pages_bytes(self, buf, layer, page_idx):
        idx = self.torch.tensor(page_idx, dtype=self.torch.long, device=buf.device)
        return buf[layer].view(self.pages, PAGE * self.item)[idx]


def chunk_offset(layout: str, layers: int, chunk: int, kv: int, layer: int) -> int:
    """The byte contract of kv_layout.hpp: where the (K|V, layer) chunk of a page sits in its value."""
    if layout == "page_first":
        return (kv * layers + layer) * chunk
    if layout == "layer_first":
        return (layer * 2 + kv) * chunk
    raise ValueError(layout)


class Copies:
    """Backup and restore of pool pages <-> the values of a plan, on the GPU (Fluxon's CUDA kernels)
    or the CPU (the reference copies). The restore is layer by layer: ``launch`` queues every
    layer's copy (GPU: on a side stream, an event after each), ``before_layer(i)`` makes layer i's
    bytes ready for the compute (GPU: the compute stream waits on event i; CPU: the copy itself)."""

    def __init__(self, fluxon, torch, gpu: bool, layers: int, path: str):
        self.kv, self.torch, self.gpu, self.layers, self.path = fluxon.kv, torch, gpu, layers, path
        if gpu:
            self.one = self.kv.GpuCopier()
            # One copier per layer: a copier waits for its previous upload of plan pointers before the
            # next, so one shared copier would hold the host back while the layers queue.
            self.per_layer = [self.kv.GpuCopier() for _ in range(layers)]
            self.side = torch.cuda.Stream()
            self.start = torch.cuda.Event(enable_timing=True)
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(layers)]
        self.pending = None

    def backup(self, plan, layout, item, kp, vp, pages):
        args = (plan, layout, self.layers, PAGE, item, kp, vp, array.array("q", pages))
        if self.gpu:
            self.one.write_pages_to_values(*args, stream=self.torch.cuda.current_stream().cuda_stream, path=self.path)
            self.torch.cuda.synchronize()  # raises if the kernel failed
        else:
            self.kv.copy_pages_cpu("backup", *args)

    def launch(self, plan, layout, item, kp, vp, pages, layerwise=True):
        args = (plan, layout, self.layers, PAGE, item, kp, vp, array.array("q", pages))
        if not self.gpu:
            self.pending = args
            return
        torch = self.torch
        self.side.wait_stream(torch.cuda.current_stream())  # the fresh pool is ready before the copies write it
        self.start.record(self.side)
        if layerwise:
            for i in range(self.layers):
                self.per_layer[i].restore_pages_from_values(*args, layer=i, stream=self.side.cuda_stream,
                                                            path=self.path)
                self.events[i].record(self.side)
        else:
            self.one.restore_pages_from_values(*args, stream=self.side.cuda_stream, path=self.path)
            for e in self.events:
                e.record(self.side)

    def before_layer(self, i):
        if self.gpu:
            self.torch.cuda.current_stream().wait_event(self.events[i])
        else:
            self.kv.copy_pages_cpu("restore", *self.pending, layer=i)

    def restore_all_now(self, plan, layout, item, kp, vp, pages):
        """All layers in one call, nothing else on the GPU: the restore's own throughput (seconds)."""
        args = (plan, layout, self.layers, PAGE, item, kp, vp, array.array("q", pages))
        torch = self.torch
        torch.cuda.synchronize()
        self.start.record(self.side)
        self.one.restore_pages_from_values(*args, stream=self.side.cuda_stream, path=self.path)
        self.events[-1].record(self.side)
        torch.cuda.synchronize()
        return self.start.elapsed_time(self.events[-1]) / 1e3


def run_continuation(model, cont_ids, layer_kv, before_layer=None, after_ready=None):
    """The continuation's logits with the cache built layer by layer from ``layer_kv(i)`` (views of a
    pool, or the prefill's tensors): layer 0 before the forward (the model reads the cached length
    there), layer i in a forward pre-hook of decoder layer i, after ``before_layer(i)`` made its
    bytes ready -- nothing reads a layer's KV before its restore is done."""
    cache = model.new_cache()

    def fill(i):
        if before_layer is not None:
            before_layer(i)
        if after_ready is not None:
            after_ready(i)
        k, v = layer_kv(i)
        cache.update(k, v, i)

    fill(0)
    hooks = [layer.register_forward_pre_hook(lambda mod, args, i=i: fill(i))
             for i, layer in enumerate(model.layers) if i > 0]
    try:
        return model.logits(cont_ids, cache, cont_ids.shape[1])
    finally:
        for h in hooks:
            h.remove()


def page_keys(tokens, ns: str):
    """SGLang-like page keys: a SHA-256 chain over the previous page's hash and this page's token
    ids, the model/layout namespace in front and the TP rank/size suffix at the end."""
    keys, prev = [], b""
    for p in range(len(tokens) // PAGE):
        h = hashlib.sha256(prev)
        h.update(array.array("i", tokens[p * PAGE:(p + 1) * PAGE]).tobytes())
        prev = h.digest()
        keys.append(f"{ns}{prev.hex()}_0_1")
    return keys


def rel_err(a, b) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def bit_equal(torch, a, b) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def one_page_misplaced(t):
    """[1, h, seq, d] with page 1 holding page 0's KV (with one page, a shifted copy of it)."""
    t = t.clone()
    if t.shape[2] >= 2 * PAGE:
        t[:, :, PAGE:2 * PAGE] = t[:, :, :PAGE]
    else:
        t[:, :, 1:] = t[:, :, :-1].clone()
    return t


class Checks:
    def __init__(self, label):
        self.label, self.items = label, []

    def add(self, name, ok, detail=""):
        self.items.append((name, bool(ok), detail))
        log(f"    [{'PASS' if ok else 'FAIL'}] {name}: {detail}")
        return ok

    @property
    def ok(self):
        return bool(self.items) and all(ok for _, ok, _ in self.items)

    def failed(self):
        return [n for n, ok, _ in self.items if not ok]


# --------------------------------------------------------------------------------------------

def run_model_prefix(a, fluxon, torch, client, model, P, seg, summary):
    """One (model, prefix length): prefill, references, then every layout."""
    gpu = a.gpu
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    dev = a.device
    gen = torch.Generator().manual_seed(a.seed * 1000003 + P)
    tokens = torch.randint(1, model.vocab, (P + a.cont_tokens,), generator=gen).tolist()
    prefix_ids = torch.tensor([tokens[:P]], device=dev)
    cont_ids = torch.tensor([tokens[P:]], device=dev)
    full_ids = torch.tensor([tokens], device=dev)
    cont = a.cont_tokens
    n = P // PAGE
    tol = TOLERANCE[a.dtype] * (MOE_TOLERANCE_FACTOR if model.kind == "mla" else 1.0)
    log(f"\n== [{time.perf_counter() - T0:.1f} s] {model.kind}, prefix {P} tokens ({n} pages) + continuation "
        f"{cont} tokens")

    # The first request: prefill, and its KV as the model's cache holds it.
    cache = model.new_cache()
    model.logits(prefix_ids, cache, 1)
    kv = [(k.detach(), v.detach()) for k, v in model.extract(cache)]
    del cache
    L = len(kv)
    heads, kdim, vdim = kv[0][0].shape[1], kv[0][0].shape[-1], kv[0][1].shape[-1]
    if kv[0][1].shape[1] != heads or kv[0][0].shape[-2] != P:
        raise RuntimeError(f"unexpected cache shapes K {tuple(kv[0][0].shape)} V {tuple(kv[0][1].shape)}")
    dim = max(kdim, vdim)
    note = ""
    if kdim != vdim:
        # Which MLA cache this transformers keeps: 5.17's DeepseekV2 (seen on the H200) caches the
        # latent (one head: c_kv, kv_lora_rank wide, as K; the shared RoPE key k_pe, qk_rope_head_dim
        # wide, as V); a decompressed cache would have per-head K/V. Say which, from shapes and config.
        cfg = getattr(model.module, "config", None)
        esize = kv[0][0].element_size()
        latent = (getattr(cfg, "kv_lora_rank", None), getattr(cfg, "qk_rope_head_dim", None))
        if heads == 1 and (kdim, vdim) == latent:
            note = (f"the cache holds MLA's latent, not decompressed K/V: one head, c_kv ({kdim} wide) as K and "
                    f"k_pe ({vdim}) as V, stored with the K/V layouts, V padded to {dim} (one item size for K and "
                    f"V): {2 * dim * esize} B a token a layer, against {(kdim + vdim) * esize} B for the latent")
        else:
            note = (f"the cache holds decompressed K/V (K head dim {kdim}, V {vdim}, {heads} heads), not the "
                    f"latent: the K/V layouts, V padded to {dim} per head (one item size for K and V)")
        log(f"  note: {note}")

    # References: full recompute, continuation from the in-memory prefill KV (twice: is the forward
    # deterministic here?), and two controls that the tolerance must be able to see: the KV of another
    # prompt (a restore of the wrong pages), and this KV with page 1 replaced by page 0 (one misplaced
    # page). Reordering pages would be no control: once RoPE is in K, attention over the cached keys
    # does not depend on their order.
    ref = model.logits(full_ids, model.new_cache(), cont)
    orig = run_continuation(model, cont_ids, lambda i: kv[i])
    orig2 = run_continuation(model, cont_ids, lambda i: kv[i])
    other_ids = torch.randint(1, model.vocab, (1, P), generator=gen).to(dev)
    other_cache = model.new_cache()
    model.logits(other_ids, other_cache, 1)
    other_kv = model.extract(other_cache)
    control = run_continuation(model, cont_ids, lambda i: other_kv[i])
    other_cache = other_kv = None  # free them
    misplaced = run_continuation(model, cont_ids, lambda i: (one_page_misplaced(kv[i][0]),
                                                             one_page_misplaced(kv[i][1])))
    sync()
    deterministic = bit_equal(torch, orig, orig2)
    err_orig, err_control, err_misplaced = rel_err(orig, ref), rel_err(control, ref), rel_err(misplaced, ref)
    del orig2, control, misplaced
    log(f"  prefix KV: {L} layers x K/V [1, {heads}, {P}, {kdim}/{vdim}] {a.dtype};"
        f" rel L2 err of the continuation's logits against a full recompute: from the in-memory KV {err_orig:.2e},"
        f" from another prompt's KV {err_control:.2e}, with one page misplaced {err_misplaced:.2e}")

    recompute_ms = None
    if gpu:
        def recompute():
            sync()
            t0 = time.perf_counter()
            out = model.logits(full_ids, model.new_cache(), cont)
            sync()
            dt = time.perf_counter() - t0
            if rel_err(out, ref) > tol:
                raise RuntimeError("a timed recompute differs from the reference")
            return dt
        recompute()  # warm-up
        recompute_ms = [1e3 * recompute() for _ in range(a.repeats)]

    copies = Copies(fluxon, torch, gpu, L, a.copy_path)
    rng = random.Random(a.seed + P)
    pool_pages = n + n // 8 + 2
    scatter = rng.sample(range(pool_pages), n)  # the prompt's pages, scattered over the pool as a server's are

    for layout in a.layouts:
        checks = Checks(f"{model.kind}/{layout}/{P}")
        row = {"model": model.kind, "layout": layout, "prefix_tokens": P, "pages": n, "checks": checks,
               "recompute_ms": recompute_ms}
        summary.append(row)
        log(f"  -- [{time.perf_counter() - T0:.1f} s] layout {layout}")
        ns = f"{a.run_tag}-{model.kind}-{layout}:"
        try:
            run_layout(a, fluxon, torch, client, model, P, seg, layout, ns, kv, heads, kdim, vdim, dim, tokens, n,
                       scatter, pool_pages, copies, ref, orig, deterministic, (err_control, err_misplaced), tol, checks,
                       row, note)
        except Exception as e:  # a failed call: the case fails, with no time
            checks.add("error", False, f"{type(e).__name__}: {e}")
            for k in ("restore_ms", "restore_serial_ms", "restore_gbps", "overlap_gbps"):
                row.pop(k, None)
            with contextlib.suppress(Exception):  # the next cases may need the room
                client.remove_prefix(ns)
        if gpu:
            torch.cuda.empty_cache()


def model_dtype(torch, a):
    return getattr(torch, a.dtype)


def run_layout(a, fluxon, torch, client, model, P, seg, layout, ns, kv, heads, kdim, vdim, dim, tokens, n, scatter,
               pool_pages, copies, ref, orig, deterministic, controls, tol, checks, row, note):
    gpu = a.gpu
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    dtype = model_dtype(torch, a)
    L = len(kv)
    cont_ids = torch.tensor([tokens[P:]], device=a.device)

    # The backup pool: the first request's KV at scattered pages.
    src = KvPool(torch, L, pool_pages, heads, dim, dtype, a.device)
    for i, (k, v) in enumerate(kv):
        src.store(i, k, v, scatter)
    item = src.item
    vb = fluxon.kv.value_bytes(layout, L, PAGE, item)
    row.update(item_bytes=item, value_bytes=vb, kv_bytes=n * vb, note=note)
    keys = page_keys(tokens[:P], ns)
    parents = [""] + keys[:-1]

    # 1. Backup: put_start -> copy -> commit -> routes live.
    t0 = time.perf_counter()
    plan = client.local_fast_put_start(keys, vb, fluxon.PutOptionalArgs(radix_parent_keys=parents))
    try:
        lens = fluxon.plan_lengths(plan)
        if lens != [vb] * n:
            raise RuntimeError(f"put plan holds {len(lens)} values of {sorted(set(lens))} bytes, expected {n} of {vb}")
        kp, vp = src.ptrs()
        copies.backup(plan, layout, item, kp, vp, scatter)
    except BaseException:
        client.put_abort(plan)
        raise
    fut = client.local_fast_put_commit(plan)
    fut.result(timeout_s=120)
    backup_s = time.perf_counter() - t0
    row["backup_gbps"] = n * vb / backup_s / 1e9
    checks.add("backup", True, f"{n} values of {fmt_bytes(vb)} ({fmt_bytes(n * vb)}) put, copied, committed, routes "
               f"live in {1e3 * backup_s:.1f} ms")

    # 2. The second request: the shared prefix and new tokens; its full pages' keys.
    keys2 = page_keys(tokens, ns)
    dst = KvPool(torch, L, n, heads, dim, dtype, a.device)
    dkp, dvp = dst.ptrs()
    dst_pages = list(range(n))

    def start_get():
        h, r = client.get_start(keys2)
        if r.transferable_len != n or r.raw_prefix_hit_len != n or r.local_keys != n:
            client.cancel_get_transfer(h)
            raise RuntimeError(f"get_start: transferable {r.transferable_len}, raw hit {r.raw_prefix_hit_len}, local "
                               f"{r.local_keys} of the {n} shared pages ({len(keys2)} keys asked)")
        rp = client.get_transfer(h)
        return r, rp

    def flip(i):  # --corrupt-restore: one byte of a restored K value, once its layer is there
        if a.corrupt_restore and i == L // 2:
            off = (3 * PAGE + 5) % (n * PAGE) * dst.item + dst.esize - 1  # the high byte of an element
            dst.k[i].view(-1)[off:off + 1].bitwise_xor_(1)

    dst.k.fill_(0x7F)
    dst.v.fill_(0x7F)
    sync()
    r, rp = start_get()
    try:
        checks.add("hit", True, f"get_start: {r.transferable_len} of {len(keys2)} keys transferable, all local; first "
                   f"miss {r.first_miss_index} (the new tokens)")
        lens = fluxon.plan_lengths(rp)
        checks.add("plan", lens == [vb] * n, f"get_transfer plan: {len(lens)} values of {sorted(set(lens))} bytes")
        # The byte contract: sampled (page, layer, K|V) chunks sit in the value where kv_layout.hpp says.
        ptrs = fluxon.plan_pointers(rp)
        chunk = PAGE * item
        bad = []
        for p in sorted({0, n // 2, n - 1}):
            for layer in sorted({0, L - 1}):
                for kvi, buf in ((0, src.k), (1, src.v)):
                    got = ctypes.string_at(ptrs[p] + chunk_offset(layout, L, chunk, kvi, layer), chunk)
                    want = src.pages_bytes(buf, layer, [scatter[p]])[0].cpu()
                    if not torch.equal(torch.frombuffer(bytearray(got), dtype=torch.uint8), want):
                        bad.append((p, layer, "KV"[kvi]))
        checks.add("layout", not bad, f"sampled chunks at the {layout} offsets" + (f"; wrong: {bad}" if bad else ""))
        copies.launch(rp, layout, item, dkp, dvp, dst_pages)
        restored = run_continuation(model, cont_ids, lambda i: dst.view(i, P, kdim, vdim), copies.before_layer, flip)
        sync()
    finally:
        sync()
        client.release_views(rp)

    bad_layers = [i for i in range(L) if not (
        torch.equal(dst.pages_bytes(dst.k, i, dst_pages), src.pages_bytes(src.k, i, scatter)) and
        torch.equal(dst.pages_bytes(dst.v, i, dst_pages), src.pages_bytes(src.v, i, scatter)))]
    checks.add("restored-bytes", not bad_layers, f"restored pool == backed-up pages, {L} layers x K/V x {n} pages"
               + (f"; layers differing: {bad_layers}" if bad_layers else ""))
    checks.add("logits-bitexact", bit_equal(torch, restored, orig),
               "continuation from restored KV == from the in-memory prefill KV, bit for bit"
               + ("" if deterministic else " (note: two runs from the in-memory KV differed: the forward is "
                                           "not deterministic here)"))
    err = rel_err(restored, ref)
    checks.add("logits-vs-recompute", err <= tol,
               f"rel L2 err {err:.2e} against a full recompute, tolerance {tol:.0e} (not bit for bit: the recompute "
               f"runs other matmul and attention shapes, which reorders float sums)")
    err_control, err_misplaced = controls
    checks.add("control", err_control > tol,
               f"another prompt's KV must miss the tolerance: rel err {err_control:.2e} (one misplaced "
               f"page: {err_misplaced:.2e}, {'also' if err_misplaced > tol else 'NOT'} beyond it)")
    row["err_recompute"], row["err_control"], row["err_one_page_misplaced"] = err, err_control, err_misplaced

    # 3. GPU: time to first token, restore vs recompute; restore throughput vs the link. A case
    # whose checks failed is not timed: a time of a wrong restore means nothing.
    if gpu and not checks.ok:
        log("    timing skipped: a check failed")
    elif gpu:
        def ttft(layerwise):
            dst.k.fill_(0x7F)
            dst.v.fill_(0x7F)
            sync()
            t0 = time.perf_counter()
            _, rp = start_get()
            try:
                copies.launch(rp, layout, item, dkp, dvp, dst_pages, layerwise=layerwise)
                out = run_continuation(model, cont_ids, lambda i: dst.view(i, P, kdim, vdim), copies.before_layer)
                sync()
                dt = time.perf_counter() - t0
            finally:
                sync()
                client.release_views(rp)
            if not bit_equal(torch, out, orig):
                raise RuntimeError("a timed restore gave other logits than the in-memory KV")
            return dt, copies.start.elapsed_time(copies.events[-1]) / 1e3

        ttft(True)  # warm-up
        over = [ttft(True) for _ in range(a.repeats)]
        serial = [ttft(False) for _ in range(a.repeats)]

        def alone():
            _, rp = start_get()
            try:
                return copies.restore_all_now(rp, layout, item, dkp, dvp, dst_pages)
            finally:
                client.release_views(rp)
        alone_s = [alone() for _ in range(a.repeats)]
        nbytes = n * vb
        row["restore_ms"] = [1e3 * t for t, _ in over]
        row["restore_serial_ms"] = [1e3 * t for t, _ in serial]
        row["overlap_gbps"] = nbytes / statistics.median([s for _, s in over]) / 1e9
        row["restore_gbps"] = nbytes / statistics.median(alone_s) / 1e9
        row.update(link_gbps(torch, seg, nbytes, a.repeats))
        checks.add("timing", True, f"{a.repeats} timed restores, each a full hit and bit-exact")
        log(f"    TTFT: restore {statistics.median(row['restore_ms']):.1f} ms (layer-wise, overlapped), "
            f"{statistics.median(row['restore_serial_ms']):.1f} ms (restore, then forward); recompute "
            f"{statistics.median(row['recompute_ms']):.1f} ms; restore alone {row['restore_gbps']:.1f} GB/s, "
            f"overlapped {row['overlap_gbps']:.1f} GB/s; link {row['link_pinned_gbps']:.1f} GB/s (pinned), "
            f"{row['link_segment_gbps']:.1f} GB/s (Fluxon segment)")
    removed = client.remove_prefix(ns)
    checks.add("removed", removed == n, f"remove_prefix: {removed} of {n} values")


_link_cache = {}


def link_gbps(torch, seg, nbytes, repeats):
    """A contiguous host-to-device copy of nbytes (cudaMemcpyAsync via torch): from pinned memory, and
    from the registered Fluxon segment itself."""
    if nbytes in _link_cache:
        return _link_cache[nbytes]
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(src):
        out = []
        for _ in range(repeats + 1):
            torch.cuda.synchronize()
            s.record()
            dst.copy_(src, non_blocking=True)
            e.record()
            torch.cuda.synchronize()
            out.append(s.elapsed_time(e) / 1e3)
        return nbytes / statistics.median(out[1:]) / 1e9

    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pinned.fill_(1)
    r = {"link_pinned_gbps": timed(pinned)}
    del pinned
    segt = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(seg["read_ptr"]), dtype=torch.uint8)
    r["link_segment_gbps"] = timed(segt)
    r["segment_seen_pinned"] = bool(segt.is_pinned())
    _link_cache[nbytes] = r
    return r


# --------------------------------------------------------------------------------------------

def plan_owner_dram(a, kinds_shapes):
    """The owner's segment from the KV bytes: every case's values at once when /dev/shm has room,
    else room for the largest case per value size (cases are removed when done)."""
    mib = 1 << 20
    per_class = {}  # value bytes -> [bytes per case]
    for layers, item in kinds_shapes:
        vb = 2 * layers * PAGE * item
        per_class.setdefault(vb, [])
        for P in a.prefix_tokens:
            for _ in a.layouts:
                per_class[vb].append(P // PAGE)
    slot = lambda vb: -(-vb // 4096) * 4096  # noqa: E731
    grant = max(16 * mib, -(-8 * max(slot(vb) for vb in per_class) // mib) * mib)

    def need(all_at_once):
        total = 0
        for vb, cases in per_class.items():
            per_grant = grant // slot(vb)
            values = sum(cases) if all_at_once else max(cases)
            total += (-(-values // per_grant) + 2) * grant
        return total + 64 * mib

    full, lean = need(True), need(False)
    try:
        st = os.statvfs("/dev/shm")
        shm = st.f_bavail * st.f_frsize
    except OSError:
        shm = None
    if a.owner_dram:
        dram = parse_size(a.owner_dram)
        why = "--owner-dram"
    elif shm is None or full <= 0.9 * shm:
        dram, why = full, "every case at once"
    else:
        dram, why = lean, "the largest case per value size; /dev/shm has " + fmt_bytes(shm)
    if shm is not None and dram > shm:
        raise SystemExit(f"real_kv: the owner segment needs {fmt_bytes(dram)} but /dev/shm has {fmt_bytes(shm)} free")
    dram = -(-dram // mib) * mib
    return dram, min(grant, dram), why


def kv_shape_of(torch, model, a):
    """(layers, item bytes) of the model's cache, from a one-page prefill."""
    cache = model.new_cache()
    ids = torch.randint(1, model.vocab, (1, PAGE), generator=torch.Generator().manual_seed(1)).to(a.device)
    model.logits(ids, cache, 1)
    kv = model.extract(cache)
    k, v = kv[0]
    return len(kv), k.shape[1] * max(k.shape[-1], v.shape[-1]) * k.element_size()


def print_table(summary, a):
    log("\n" + "=" * 100)
    hdr = (f"{'model':<6} {'layout':<12} {'prefix':>7} {'KV bytes':>11} {'checks':<30} {'TTFT: restore':>13} "
           f"{'serial':>8} {'recompute':>10} {'speedup':>7} {'GB/s: restore':>13} {'overlap':>8} {'link pinned':>11} "
           f"{'segment':>8}")
    log(hdr)
    log("-" * len(hdr))
    notes = []
    for r in summary:
        c = r["checks"]
        passed = sum(ok for _, ok, _ in c.items)
        cs = f"{passed}/{len(c.items)} pass" if c.ok else "FAIL: " + ",".join(c.failed())
        if "restore_ms" in r and r.get("recompute_ms"):
            rs, rc = statistics.median(r["restore_ms"]), statistics.median(r["recompute_ms"])
            t = (f"{rs:11.1f}ms {statistics.median(r['restore_serial_ms']):6.1f}ms {rc:8.1f}ms {rc / rs:6.2f}x "
                 f"{r['restore_gbps']:13.1f} {r['overlap_gbps']:8.1f} {r['link_pinned_gbps']:11.1f} "
                 f"{r['link_segment_gbps']:8.1f}")
        else:
            t = "(not timed: a check failed)" if not c.ok else "(CPU: not timed)" if not a.gpu else "(not timed)"
        log(f"{r['model']:<6} {r['layout']:<12} {r['prefix_tokens']:>7} {fmt_bytes(r.get('kv_bytes', 0)):>11} "
            f"{cs:<30} {t}")
        if r.get("note") and r["note"] not in notes:
            notes.append(r["note"])
    if a.gpu:
        log("TTFT (medians): restore = get_start + get_transfer + restore layer by layer on a side stream, overlapped "
            "with the continuation's forward; serial = the whole restore, then the forward; recompute = the full "
            "prefill of prefix + continuation. GB/s: restore = the all-layer restore kernel alone; overlap = the "
            "layer-wise restore during the forward; link = a contiguous host-to-device copy of the same bytes from "
            "pinned memory / from the registered Fluxon segment.")
    for n in notes:
        log(f"note: {n}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if usable")
    ap.add_argument("--prefix-tokens", default=None, help="shared prefix lengths, multiples of 64 "
                    "(default: 4096,16384 on cuda, 256 on cpu)")
    ap.add_argument("--cont-tokens", type=int, default=64, help="new tokens of the second request")
    ap.add_argument("--models", default="gqa,mla", help="gqa (Llama), qwen2, mla (DeepSeek-V2)")
    ap.add_argument("--layouts", default="page_first,layer_first")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats (GPU), medians reported")
    ap.add_argument("--owner-dram", default=None, help="the owner's segment (default: sized from the KV bytes)")
    ap.add_argument("--shape", choices=["full", "tiny"], default=None,
                    help="model size (default: full on cuda -- Llama-3-8B / DeepSeek-V2-Lite shapes --, tiny on cpu)")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--copy-path", choices=["sm", "copy_engine", "few_sm"], default="sm", help="GPU copy path")
    ap.add_argument("--no-transformers", action="store_true", help="use the in-script GQA model even if "
                    "transformers is installed")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--corrupt-restore", action="store_true",
                    help="debug: flip one byte of a restored value; the checks must fail")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON (last line)")
    a = ap.parse_args(argv)

    if a.device in (None, "cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # reproducible cuBLAS sums
    import torch
    fluxon = import_fluxon()
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() and fluxon.kv.HAVE_CUDA else "cpu"
    if a.device == "cuda" and not (torch.cuda.is_available() and fluxon.kv.HAVE_CUDA):
        raise SystemExit("real_kv: --device cuda needs a GPU, a CUDA torch and a Fluxon built with CUDA")
    gpu = a.gpu = a.device == "cuda"
    a.shape = a.shape or ("full" if gpu else "tiny")
    a.dtype = DTYPES.get(a.dtype or ("bfloat16" if gpu else "float32"))
    if a.dtype is None:
        raise SystemExit("real_kv: --dtype: float32, bfloat16 or float16")
    a.prefix_tokens = [int(x) for x in (a.prefix_tokens or ("4096,16384" if gpu else "256")).split(",")]
    if any(p <= 0 or p % PAGE for p in a.prefix_tokens):
        raise SystemExit(f"real_kv: --prefix-tokens must be positive multiples of {PAGE}")
    if a.cont_tokens <= 0 or a.repeats <= 0:
        raise SystemExit("real_kv: --cont-tokens and --repeats must be > 0")
    a.models = [m for m in a.models.split(",") if m]
    a.layouts = [x for x in a.layouts.split(",") if x]
    for m in a.models:
        if m not in CONFIG_CLASS:
            raise SystemExit(f"real_kv: unknown model {m!r} (gqa, qwen2, mla)")
    for x in a.layouts:
        if x not in ("page_first", "layer_first"):
            raise SystemExit(f"real_kv: layout {x!r}: page_first or layer_first (the K/V layouts)")
    a.run_tag = f"rkv{os.getpid()}x{int(time.time())}"
    torch.set_grad_enabled(False)
    if not gpu:
        torch.set_num_threads(min(2, os.cpu_count() or 1))

    try:
        importlib.import_module("transformers")
        have_tf = not a.no_transformers
    except ImportError:
        have_tf = False
    dtype = getattr(torch, a.dtype)
    log(f"real_kv: device {a.device}" + (f" ({torch.cuda.get_device_name(0)})" if gpu else "") +
        f", torch {torch.__version__}, dtype {a.dtype}, Fluxon {fluxon.__version__}, copies: "
        + (f"CUDA kernels (GpuCopier, path {a.copy_path})" if gpu else "CPU reference (copy_pages_cpu)"))
    if not have_tf:
        log("real_kv: transformers " + ("not used (--no-transformers)" if a.no_transformers else "is not installed")
            + ": the GQA model is the in-script Llama-style decoder (plain torch)")

    # Models first (their cache shapes size the owner's segment).
    models, shapes, absent, summary = [], [], [], []
    for kind in a.models:
        try:
            if have_tf:
                m, why = build_hf_model(torch, kind, a.shape, dtype, a.device, a.seed)
            elif kind == "gqa":
                m, why = build_tiny_model(torch, a.shape, dtype, a.device, a.seed), None
            else:
                m, why = None, (f"transformers is {'not used' if a.no_transformers else 'not installed'} (this "
                                f"model needs its {CONFIG_CLASS[kind]}; only gqa has an in-script fallback)")
            if m is None:
                log(f"real_kv: {kind}: absent -- {why}")
                absent.append({"model": kind, "why": why})
                continue
            log(f"real_kv: {m.desc}")
            shapes.append(kv_shape_of(torch, m, a))
            models.append(m)
        except Exception as e:  # a model that cannot be built or run fails its cases; the others still run
            c = Checks(kind)
            log(f"real_kv: {kind}:")
            c.add("model", False, f"building or running the model failed: {type(e).__name__}: {e}")
            summary.append({"model": kind, "layout": "-", "prefix_tokens": 0, "checks": c})
    if not models:
        print_table(summary, a)
        log("real_kv: FAILED: no model to run" if summary else "real_kv: no model to run")
        return 1

    dram, grant, why = plan_owner_dram(a, shapes)
    log(f"real_kv: owner segment {fmt_bytes(dram)} ({why}), grants of {fmt_bytes(grant)}")

    daemons, client, rc = daemons_of(dram, grant), None, 1
    # A kill by timeout must still bring the daemons down (cluster up detaches them).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        daemons.up()
        client = fluxon.KvClient(daemons.client_config(0, rpc_timeout_ms=60000))
        segs = client.wait_local_segments_ready()
        if not segs or segs[0]["segment_label"] != "external_owner:0" or segs[0]["len"] < dram // 2:
            raise RuntimeError(f"unexpected segments: {segs}")
        seg = segs[0]
        log(f"real_kv: attached to the owner daemon at {daemons.owner_address(0)}, segment "
            f"{seg['segment_label']} of {fmt_bytes(seg['len'])}")
        if gpu:
            t0 = time.perf_counter()
            client.register_segments_with_cuda()
            log(f"real_kv: segment registered with CUDA in {time.perf_counter() - t0:.2f} s")
        for idx in range(len(models)):
            m = models[idx]
            for P in a.prefix_tokens:
                try:
                    run_model_prefix(a, fluxon, torch, client, m, P, seg, summary)
                except Exception as e:
                    c = Checks(f"{m.kind}/{P}")
                    c.add("error", False, f"{type(e).__name__}: {e}")
                    summary.append({"model": m.kind, "layout": "-", "prefix_tokens": P, "checks": c})
                if gpu:
                    torch.cuda.empty_cache()
            models[idx] = m = None  # free its weights before the next model runs
            if gpu:
                torch.cuda.empty_cache()
        rc = 0 if summary and all(r["checks"].ok for r in summary) else 1
    finally:
        if client is not None:
            client.close()
        daemons.down()

    print_table(summary, a)
    for x in absent:
        log(f"{x['model']:<6} absent: {x['why']}")
    failed = [f"{r['model']}/{r['layout']}/{r['prefix_tokens']}: {','.join(r['checks'].failed())}"
              for r in summary if not r["checks"].ok]
    log("real_kv: " + ("ALL CHECKS PASSED" if rc == 0 else "FAILED: " + "; ".join(failed)))
    if a.json:
        out = {"device": a.device, "dtype": a.dtype, "torch": torch.__version__, "absent": absent,
               "cases": [{**{k: v for k, v in r.items() if k != "checks"},
                          "checks": [{"name": n, "ok": ok, "detail": d} for n, ok, d in r["checks"].items],
                          "ok": r["checks"].ok} for r in summary], "ok": rc == 0}
        print(json.dumps(out))
    return rc


if __name__ == "__main__":
    sys.exit(main())
