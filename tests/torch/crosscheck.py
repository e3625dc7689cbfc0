#!/usr/bin/python3
"""Cross-checks an FP32 mpsim training run against PyTorch.

usage: crosscheck.py DUMP_DIR

DUMP_DIR is what tests/torch/crosscheck_dump.cpp wrote: the model, the
optimiser, the initial weights, every step's batch, and mpsim's loss,
gradients and weights at every step (manifest.txt describes the files).

The script rebuilds the network in PyTorch (CPU, binary32, one thread) and
makes three comparisons, each printed as a table of the largest deviation
per step:

  local   PyTorch's forward and backward pass at mpsim's own weights of step
          s on batch s: loss and every gradient. No error carries over from
          earlier steps, so this is the tight check of the layers.
  replay  PyTorch's optimiser fed mpsim's gradients, from the initial
          weights: the weights after every step against mpsim's. Checks the
          optimiser alone (momentum, weight decay, Adam's moments and bias
          corrections, AdamW's decoupled decay).
  free    PyTorch trains on its own from the same initial weights and
          batches: loss and gradients per step. Rounding differences compound
          through the steps, so the tolerance grows with the step.

Deviations: loss |l_torch - l_mpsim| / |l_mpsim|; a tensor
max|t_torch - t_mpsim| / max|t_mpsim| (relative to the largest magnitude of
that tensor, so elements that cancel to nearly zero do not dominate).

Exit status: 0 when everything is within tolerance, 1 on a mismatch (named by
case, check, step and tensor), 2 on bad input.
"""

import math
import os
import sys
import warnings
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

U = 2.0 ** -24  # unit roundoff of binary32 (round to nearest)


# ---------------------------------------------------------------- the dump

class Dump:
    def __init__(self, folder):
        self.folder = folder
        self.config = {}
        self.params = []  # (name, shape) in model order
        self.initial = {}
        self.losses = {}
        self.batches = {}  # step -> (images, labels)
        self.grads = {}    # step -> name -> array
        self.weights = {}  # step -> name -> array (the weights step s's forward used)
        self.final = {}
        self.dropouts = {}  # step -> the forward pass's dropout factors, in call order (flat binary32 arrays)
        with open(os.path.join(folder, "manifest.txt")) as f:
            for line in f:
                words = line.split()
                if not words:
                    continue
                key = words[0]
                if key == "param":
                    name, file, shape = words[1], words[2], tuple(int(d) for d in words[3:])
                    self.params.append((name, shape))
                    self.initial[name] = self.read(file, shape)
                elif key == "step":
                    s = int(words[1])
                    fields = dict(zip(words[2::2], words[3::2]))
                    self.losses[s] = float(fields["loss"])
                    self.batches[s] = (fields["images"], fields["labels"])
                elif key in ("grad", "weight"):
                    table = self.grads if key == "grad" else self.weights
                    table.setdefault(int(words[1]), {})[words[2]] = words[3]
                elif key == "final":
                    self.final[words[1]] = words[2]
                elif key == "mask":
                    self.dropouts.setdefault(int(words[1]), []).append((words[2], int(words[3])))
                elif key == "losses":
                    self.loss_file = words[1]
                else:
                    self.config[key] = words[1:]
        self.shapes = dict(self.params)
        self.steps = int(self.config["steps"][0])
        self.batch = int(self.config["batch"][0])
        self.labels_per_sample = int(self.config.get("labels_per_sample", ["1"])[0])
        c, h, w = (int(x) for x in self.config["input"])
        self.input_shape = (c, h, w)
        # The binary64 loss file and the manifest's decimal copies must agree.
        raw = np.fromfile(os.path.join(folder, self.loss_file), dtype="<f8")
        if len(raw) != self.steps or any(raw[s] != self.losses[s] for s in range(self.steps)):
            raise ValueError("losses.f64 does not match the manifest")
        for s in range(self.steps):
            images, labels = self.batches[s]
            self.batches[s] = (self.read(images, (self.batch,) + self.input_shape),
                               self.read(labels, (self.batch * self.labels_per_sample,)).astype(np.int64))
            self.grads[s] = {n: self.read(f, self.shapes[n]) for n, f in self.grads[s].items()}
            self.weights[s] = {n: self.read(f, self.shapes[n]) for n, f in self.weights[s].items()}
        self.final = {n: self.read(f, self.shapes[n]) for n, f in self.final.items()}
        self.dropouts = {s: [self.read(f, (n,)) for f, n in calls] for s, calls in self.dropouts.items()}

    def read(self, file, shape):
        a = np.fromfile(os.path.join(self.folder, file), dtype="<f4")
        if a.size != math.prod(shape):
            raise ValueError(f"{file}: {a.size} values, expected {math.prod(shape)} for shape {shape}")
        return a.reshape(shape)

    def get(self, key, index=0, kind=str):
        return kind(self.config[key][index])


# ------------------------------------------------------------ the network

class Table(nn.Module):
    """A learned table with mpsim's parameter name `weight` (position or token embeddings)."""

    def __init__(self, rows, cols):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, cols))


def norm_scale(weight, zero_centered):
    """The scale a norm multiplies by: its weight, or 1 + weight (model.zero_centered_gamma; Transformer Engine's
    zero_centered_gamma, written out here)."""
    return 1 + weight if zero_centered else weight


class RMSNorm(nn.Module):
    """RMSNorm (Zhang and Sennrich 2019) as mpsim's: x / sqrt(mean(x^2) + eps) * weight, no bias (PyTorch 1.13 has
    no nn.RMSNorm)."""

    def __init__(self, width, eps=1e-5, zero_centered=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps, self.zero_centered = eps, zero_centered

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * norm_scale(self.weight, self.zero_centered)


class LayerNorm(nn.Module):
    """nn.LayerNorm's function (F.layer_norm), its scale 1 + weight when zero-centred."""

    def __init__(self, width, eps=1e-5, zero_centered=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))
        self.eps, self.zero_centered = eps, zero_centered

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], norm_scale(self.weight, self.zero_centered), self.bias, self.eps)


class QkNorm(nn.Module):
    """QK-LayerNorm as mpsim's: LayerNorm over each head's q (weight[:dim], bias[:dim]) and k (the rest)."""

    def __init__(self, dim, zero_centered=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(2 * dim))
        self.bias = nn.Parameter(torch.zeros(2 * dim))
        self.dim, self.zero_centered = dim, zero_centered

    def forward(self, q, k):
        dim, scale = self.dim, norm_scale(self.weight, self.zero_centered)
        return (F.layer_norm(q, (dim,), scale[:dim], self.bias[:dim], 1e-5),
                F.layer_norm(k, (dim,), scale[dim:], self.bias[dim:], 1e-5))


def rotary_tables(tokens, dim, base):
    """cos and sin of theta = i * base^(-2c/dim), c < dim/2, in float64, rounded once to float32 (as mpsim's table)."""
    half = dim // 2
    inv = torch.tensor([base ** (-2.0 * c / dim) for c in range(half)], dtype=torch.float64)
    theta = torch.arange(tokens, dtype=torch.float64)[:, None] * inv[None, :]
    return theta.cos().float(), theta.sin().float()


def rotate_half(x, cos, sin):
    """Hugging Face LLaMA's rotary embedding: features c and c + dim/2 of each head turn by theta(position, c)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)


def soft_cap(x, cap):
    """Gemma 2's soft-capping, cap * tanh(x / cap); 0: off."""
    return x if cap <= 0 else cap * torch.tanh(x / cap)


def make_norm(kind, width, zero_centered=False):
    norm = RMSNorm if kind == "rmsnorm" else LayerNorm
    return norm(width, zero_centered=zero_centered)


class Block(nn.Module):
    """A pre-norm transformer block as core/src/model.cpp builds it: x + proj(attn(qkv(ln1(x)))), then
    x + fc2(act(fc1(ln2(x)))); q, k and v side by side in qkv's output, head h at columns h*dim. Optionally
    RMSNorm for the norms, zero-centred scales, QK-LayerNorm on q and k, a gated MLP (SwiGLU: fc1 makes
    [gate | value]) and Gemma 2's norms on the branches' outputs (ln1_post, ln2_post)."""

    def __init__(self, width, heads, mlp_width, act, causal, norm="layernorm", qk_norm=False, gated=False,
                 rotary=None, attention_softcap=0.0, zero_centered=False, post_norm=False):
        super().__init__()
        self.rotary, self.attention_softcap = rotary, attention_softcap
        self.ln1 = make_norm(norm, width, zero_centered)
        self.qkv = nn.Linear(width, 3 * width)
        if qk_norm:
            self.qk_norm = QkNorm(width // heads, zero_centered)
        self.proj = nn.Linear(width, width)
        if post_norm:  # created in mpsim's order of the parameters
            self.ln1_post = make_norm(norm, width, zero_centered)
        self.ln2 = make_norm(norm, width, zero_centered)
        self.fc1 = nn.Linear(width, 2 * mlp_width if gated else mlp_width)
        self.fc2 = nn.Linear(mlp_width, width)
        if post_norm:
            self.ln2_post = make_norm(norm, width, zero_centered)
        self.act, self.heads, self.causal, self.gated = act(), heads, causal, gated

    def forward(self, x, drop=None):
        """drop(tensor, kind): mpsim's dropout factors for the next call of `kind` (Transformer.drop)."""
        drop = drop or (lambda tensor, kind: tensor)
        b, t, w = x.shape
        dim = w // self.heads
        q, k, v = (part.reshape(b, t, self.heads, dim).transpose(1, 2) for part in self.qkv(self.ln1(x)).split(w, -1))
        if hasattr(self, "qk_norm"):
            q, k = self.qk_norm(q, k)
        if self.rotary is not None:
            q, k = rotate_half(q, *self.rotary), rotate_half(k, *self.rotary)
        scores = soft_cap(q @ k.transpose(-1, -2) / math.sqrt(dim), self.attention_softcap)  # Gemma 2: cap, then mask
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        attended = (drop(scores.softmax(-1), "attention_dropout") @ v).transpose(1, 2).reshape(b, t, w)
        post1, post2 = (getattr(self, name, lambda y: y) for name in ("ln1_post", "ln2_post"))
        x = x + drop(post1(self.proj(attended)), "dropout")
        h = self.fc1(self.ln2(x))
        if self.gated:
            gate, value = h.split(h.shape[-1] // 2, -1)
            h = self.act(gate) * value
        else:
            h = self.act(h)
        return x + drop(post2(self.fc2(h)), "dropout")


class Transformer(nn.Module):
    """The ViT (patch convolution, tokens, position table, blocks, LayerNorm, mean over tokens, head) or the GPT
    (token table, position table, causal blocks, LayerNorm, a head at every position), with mpsim's names."""

    def __init__(self, d, act):
        super().__init__()
        c, h, w = d.input_shape
        classes = d.get("classes", kind=int)
        width, heads = d.get("width", kind=int), d.get("heads", kind=int)
        depth, mlp_width = d.get("depth", kind=int), d.get("mlp_width", kind=int)
        self.vit = d.get("model") == "vit"
        if self.vit:
            patch = d.get("patch", kind=int)
            tokens = (h // patch) * (w // patch)
            self.patch = nn.Conv2d(c, width, patch, stride=patch)
        else:
            tokens = h * w
            self.embed = Table(classes, width)
        rotary = None
        if d.config.get("positions", ["learned"])[0] == "rotary":
            rotary = rotary_tables(tokens, width // heads, float(d.config["rotary_base"][0]))
        else:
            self.pos = Table(tokens, width)
        attention_softcap = float(d.config.get("attention_softcap", ["0"])[0])
        self.logit_softcap = float(d.config.get("logit_softcap", ["0"])[0])
        self.blocks = [f"block{i}" for i in range(1, depth + 1)]
        norm = d.config.get("norm", ["layernorm"])[0]
        qk_norm = d.config.get("qk_norm", ["0"])[0] == "1"
        gated = d.config.get("gated", ["0"])[0] == "1"
        zero_centered = d.config.get("zero_centered_gamma", ["0"])[0] == "1"
        post_norm = d.config.get("post_norm", ["0"])[0] == "1"
        self.embedding_scale = float(d.config.get("embedding_scale", ["0"])[0])
        for name in self.blocks:
            setattr(self, name, Block(width, heads, mlp_width, act, not self.vit, norm, qk_norm, gated, rotary,
                                      attention_softcap, zero_centered, post_norm))
        self.ln = make_norm(norm, width, zero_centered)
        self.head = nn.Linear(width, classes)
        if d.config.get("tie_embeddings", ["0"])[0] == "1":
            self.head.weight = self.embed.weight  # one parameter (named embed.weight): its gradient sums both uses
        # Dropout as mpsim places it (core/src/model.cpp): after the embeddings, on the attention probabilities
        # and after each block's two branches, where its rate is above 0; the factors are mpsim's own masks, set
        # per step by forward_backward (self.masks, an iterator over the forward pass's calls).
        self.rates = {kind: float(d.config.get(kind, ["0"])[0]) for kind in ("dropout", "attention_dropout")}
        self.masks = None

    def drop(self, x, kind):
        if self.masks is None or self.rates[kind] <= 0:
            return x
        factors = next(self.masks, None)
        if factors is None or factors.size != x.numel():
            raise ValueError(f"{kind}: no dump mask of {x.numel()} factors for this call")
        return x * torch.from_numpy(factors).to(x.dtype).reshape(x.shape)

    def forward(self, x):
        if self.vit:
            y = self.patch(x).flatten(2).transpose(1, 2)  # [batch, tokens, width]: mpsim's nchw_to_rows
        else:
            y = self.embed.weight[x.reshape(x.shape[0], -1).long()]
        if self.embedding_scale > 0:  # Gemma's, a binary32 product by the factor as mpsim rounds it
            y = y * torch.tensor(self.embedding_scale, dtype=torch.float32)
        if hasattr(self, "pos"):
            y = y + self.pos.weight
        y = self.drop(y, "dropout")
        for name in self.blocks:
            y = getattr(self, name)(y, self.drop)
        y = self.ln(y)
        if self.vit:
            return soft_cap(self.head(y.mean(1)), self.logit_softcap)
        return soft_cap(self.head(y).reshape(-1, self.head.out_features), self.logit_softcap)  # a row per position

def build_model(d):
    """The network of core/src/model.cpp, with mpsim's parameter names."""
    act = {"relu": nn.ReLU, "gelu": lambda: nn.GELU(approximate="none"), "silu": nn.SiLU}[d.get("activation")]
    act_name = d.get("activation")
    classes = d.get("classes", kind=int)
    c, h, w = d.input_shape
    layers = []
    if d.get("model") == "mlp":
        layers.append(("flatten", nn.Flatten()))
        width = c * h * w
        hidden = [int(x) for x in d.config["hidden"]]
        for i, out in enumerate(hidden, start=1):
            layers.append((f"fc{i}", nn.Linear(width, out)))
            if d.get("layer_norm", kind=int):
                layers.append((f"ln{i}", nn.LayerNorm(out, eps=1e-5)))
            layers.append((f"{act_name}{i}", act()))
            width = out
        layers.append((f"fc{len(hidden) + 1}", nn.Linear(width, classes)))
    elif d.get("model") == "cnn":
        # LeNet-5 as mpsim builds it: conv 5x5 pad 2, act, pool 2; conv 5x5, act, pool 2; 3 Linear.
        fh, fw = ((h + 4 - 4) // 2 - 4) // 2, ((w + 4 - 4) // 2 - 4) // 2
        layers += [("conv1", nn.Conv2d(c, 6, 5, stride=1, padding=2)), (f"{act_name}1", act()),
                   ("pool1", nn.MaxPool2d(2, 2)),
                   ("conv2", nn.Conv2d(6, 16, 5, stride=1, padding=0)), (f"{act_name}2", act()),
                   ("pool2", nn.MaxPool2d(2, 2)), ("flatten", nn.Flatten()),
                   ("fc1", nn.Linear(16 * fh * fw, 120)), (f"{act_name}3", act()),
                   ("fc2", nn.Linear(120, 84)), (f"{act_name}4", act()),
                   ("fc3", nn.Linear(84, classes))]
    elif d.get("model") in ("vit", "gpt"):
        layers = None
    else:
        raise ValueError(f"unknown model {d.get('model')}")
    model = nn.Sequential(OrderedDict(layers)) if layers is not None else Transformer(d, act)
    names = [n for n, _ in model.named_parameters()]
    if names != [n for n, _ in d.params]:
        raise ValueError(f"parameter names differ: torch {names}, mpsim {[n for n, _ in d.params]}")
    for n, p in model.named_parameters():
        if tuple(p.shape) != d.shapes[n]:
            raise ValueError(f"{n}: torch shape {tuple(p.shape)}, mpsim {d.shapes[n]}")
    return model


def load(model, values):
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.from_numpy(values[n]))


def make_optimizer(d, params):
    kind, lr, wd = d.get("optimizer"), d.get("lr", kind=float), d.get("weight_decay", kind=float)
    params = list(params)
    if d.config.get("decay_vectors", ["1"])[0] == "0":
        # No decay on parameters of one dimension (biases, LayerNorm): two groups, as nanoGPT builds them.
        params = [{"params": [p for p in params if p.dim() > 1]},
                  {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0}]
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=d.get("momentum", kind=float), weight_decay=wd)
    betas = (d.get("beta1", kind=float), d.get("beta2", kind=float))
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    return cls(params, lr=lr, betas=betas, eps=d.get("eps", kind=float), weight_decay=wd)


# SequentialLR (PyTorch 1.13) steps the scheduler it switches to with an epoch argument, which warns; the closed
# form it then takes is the schedule's own.
warnings.filterwarnings("ignore", message="The epoch parameter", category=UserWarning)


def make_scheduler(d, optimizer):
    """The learning-rate schedule from PyTorch's own schedulers: LinearLR for the warm-up (lr (s + 1) / warmup),
    then CosineAnnealingLR to min_lr at the last step; None for a constant rate."""
    kind, warmup, min_lr = d.get("schedule"), d.get("warmup", kind=int), d.get("min_lr", kind=float)
    if kind not in ("constant", "cosine"):
        raise ValueError(f"schedule {kind}: the cross-check runs constant and cosine")
    parts = []
    if warmup > 0:
        parts.append(torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0 / warmup, end_factor=1.0,
                                                       total_iters=warmup - 1))
    if kind == "cosine":
        parts.append(torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=d.steps - warmup - 1,
                                                                eta_min=min_lr))
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return torch.optim.lr_scheduler.SequentialLR(optimizer, parts, milestones=[warmup])


def clip(d, model):
    """clip_grad_norm_ when the run clips (mpsim's optimizer.clip_norm); returns the norm before clipping."""
    max_norm = float(d.config.get("clip_norm", ["0"])[0])
    if max_norm <= 0:
        return None
    return float(torch.nn.utils.clip_grad_norm_(list(model.parameters()), max_norm))


def forward_backward(model, d, s):
    images, labels = d.batches[s]
    model.zero_grad(set_to_none=True)
    dtype = next(model.parameters()).dtype  # binary32, or binary64 for the reference runs
    # Token ids stay integers (the embedding indexes with them); images take the model's dtype.
    inputs = torch.from_numpy(images)
    if isinstance(model, Transformer) and d.dropouts:
        model.masks = iter(d.dropouts[s])
    logits = model(inputs if d.get("model") == "gpt" else inputs.to(dtype))
    if isinstance(model, Transformer) and model.masks is not None:
        if next(model.masks, None) is not None:
            raise ValueError(f"step {s}: the forward pass used fewer dropout masks than mpsim's")
        model.masks = None
    loss = F.cross_entropy(logits, torch.from_numpy(labels), reduction="mean")
    # PaLM's z-loss, differentiated but not logged (mpsim's loss.z_loss).
    z_loss = float(d.config.get("z_loss", ["0"])[0])
    objective = loss + z_loss * (torch.logsumexp(logits, dim=-1) ** 2).mean() if z_loss else loss
    objective.backward()
    return float(loss), {n: p.grad.detach().numpy().astype(np.float64) for n, p in model.named_parameters()}


def deviation(torch_value, mpsim_value):
    scale = float(np.max(np.abs(mpsim_value)))
    diff = float(np.max(np.abs(torch_value.astype(np.float64) - mpsim_value.astype(np.float64))))
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


# ------------------------------------------------------------- tolerances
#
# Two correct binary32 implementations differ only in the order of their
# additions (blocked GEMMs, vectorised reductions, direct convolution against
# im2col), in fused multiply-adds and in their elementwise functions (exp,
# log, erf, sqrt: a few ulp each). A sum of n binary32 terms is within
# gamma_n ~ n*u of the exact sum relative to the sum of the terms'
# magnitudes, u = 2^-24, in any order (Higham, Accuracy and Stability of
# Numerical Algorithms, 2nd ed., 3.1). That worst case assumes every rounding
# errs the same way; Higham and Mary (SIAM J. Sci. Comput. 41(5), 2019) prove
# that for independent, mean-zero rounding errors the error is below
# lambda*sqrt(n)*u (same reference quantity) with probability at least
# 1 - 2n*exp(-lambda^2/2): with lambda = 8 that is 1 - 2.5e-9 per element for
# the longest sum here (n = 25088), so no element of any tensor should come
# near it. An element passes through a chain of sums (forward fan-ins, the
# softmax, the backward fan-outs, the sum over the batch or the output
# positions for a weight gradient); errors of successive stages add, hence
# the sum of sqrt(n) over the chain. Both implementations carry such an
# error, hence the factor 2. Deviations are measured relative to the largest
# magnitude in the tensor; cancellation in the batch sums makes that smaller
# than the reference quantity of the bound, and the elementwise functions add
# a few u: the margin between lambda = 8 and the typical lambda ~ 1 covers
# both (measured deviations sit 70 to 110 times below these tolerances: MLP
# 5e-7, MLP with LayerNorm 1e-6, LeNet 3.4e-6).
LAMBDA = 8.0


def reduction_chain(d):
    """Lengths of the sums along the longest path to a first-layer weight gradient."""
    c, h, w = d.input_shape
    classes = d.get("classes", kind=int)
    b = d.batch
    if d.get("model") in ("vit", "gpt"):
        # Per block forward: LayerNorm (4 row sums), qkv's fan-in, the logits' dot products, the softmax's
        # sum, the values' sum over tokens, proj, LayerNorm, fc1, fc2; then the final LayerNorm, the mean over
        # tokens (ViT), the head and the loss's softmax. Backward the same sums again, and the weight
        # gradients' sums over every position of the batch.
        width, heads = d.get("width", kind=int), d.get("heads", kind=int)
        mlp, depth = d.get("mlp_width", kind=int), d.get("depth", kind=int)
        if d.get("model") == "vit":
            patch = d.get("patch", kind=int)
            tokens = (h // patch) * (w // patch)
            first = [c * patch * patch]
        else:
            tokens, first = h * w, []
        block = [width] * 4 + [width, width // heads, tokens, tokens, width] + [width] * 4 + [width, mlp]
        if d.config.get("post_norm", ["0"])[0] == "1":
            block += [width] * 8  # the two norms on the branches' outputs
        forward = first + block * depth + [width] * 4 + ([tokens] if d.get("model") == "vit" else []) + [width]
        forward += [classes]
        return forward + forward + [b * tokens]
    if d.get("model") == "mlp":
        widths = [c * h * w] + [int(x) for x in d.config["hidden"]] + [classes]
        chain = widths[:-1] + [classes]  # forward fan-ins, the softmax's sum
        chain += widths[2:]              # input gradients of fc2..: sums over their outputs
        chain += [b]                     # fc1's weight gradient: the sum over the batch
        if d.get("layer_norm", kind=int):
            for width in widths[1:-1]:   # mean and variance forward, two row sums backward
                chain += [width] * 4
        return chain
    # LeNet: fan-ins 25c, 150, 400, 120, 84; softmax; backward through fc3, fc2,
    # fc1 (sums of 10, 84, 120 outputs), conv2's input gradient (16 channels,
    # then up to 25 overlapping patches in col2im); conv1's weight and bias
    # gradients sum over all B*H*W output positions.
    return [25 * c, 150, 400, 120, 84, classes, classes, 84, 120, 16, 25, b * h * w]


def local_tolerance(d):
    """One forward and backward pass from identical weights: no carried error."""
    return 2 * LAMBDA * sum(math.sqrt(n) for n in reduction_chain(d)) * U


def replay_tolerance(d, step):
    """The optimiser fed identical gradients: elementwise rounding only.

    Per element and step, SGD rounds 4 times (decay product and sum, momentum,
    the update), Adam/AdamW about 12 (decay, two moments, sqrt, division by
    the bias correction, eps, quotient, product, the weight update), each by
    at most u relative to a quantity no larger than the weight or its update;
    PyTorch fuses some of them (addcdiv, addcmul, lerp), so the two differ by
    at most ~16 u per step, and the error carries into every later weight
    unchanged (the update does not depend on the weight except through the
    small decay), so it grows linearly: 16 (s+1) u, doubled as a margin.
    (Measured: up to 6 u, at Adam's first step, relative to the biases'
    largest magnitude lr.)
    """
    return 2 * 16 * (step + 1) * U


# A free run carries the earlier steps' differences: at step s the weights
# differ by the optimiser's reaction to the gradient errors of steps 0..s-1,
# and a weight difference dw changes the gradient by about H*dw. With
# momentum mu an error e of one gradient moves the weights by lr*e*(1 + mu +
# ... ) <= lr*e*min(s, 1/(1-mu)), so s steps of local errors move them by at
# most lr*e*s^2; a stable run has lr*||H|| below 2*(1+mu) < 4 (else the loss
# would diverge), so the carried gradient error at step s is at most
# 4*s^2 times the local one, plus the step's own: (1 + 4 s^2) * local. Adam's
# update is lr*m/sqrt(v), insensitive to a gradient's scale, so the same
# reasoning holds with lr as the largest move per unit of relative gradient
# error. Six steps are too few for the trajectories to separate chaotically;
# the FP64 columns of the table show how far each FP32 run is from the exact
# trajectory (PyTorch in binary64): the two FP32 runs should be about equally
# far from it. Real divergences (a wrong formula, a missing term, another
# batch) show up in the local and replay checks at 1e-4 .. 1 already.


def free_tolerance(d, step):
    return local_tolerance(d) * (1 + 4 * step * step)


def free_final_values(d, name, torch_value, mpsim_value):
    """The final weights a free run can compare. The k part of a block's qkv bias has an exactly zero gradient
    (it adds q.b_k to every logit of a row, and softmax ignores a constant added to a row), so its binary32
    gradient is rounding noise; Adam divides that noise by its own root mean square and moves each of those
    biases by about lr per step in the direction of the noise's sign, which differs between two correct
    implementations. The same holds for the k half of a QK-LayerNorm's beta. The free check leaves those
    values out; the local and replay checks cover them."""
    qk_norm = d.config.get("qk_norm", ["0"])[0] == "1"  # then k's bias passes a LayerNorm: a real gradient
    rotary = d.config.get("positions", ["learned"])[0] == "rotary"  # and a rotation by the key's position
    if d.get("model") in ("vit", "gpt") and name.endswith(".qkv.bias") and not qk_norm and not rotary:
        width = d.get("width", kind=int)
        keep = np.r_[0:width, 2 * width:3 * width]
        return torch_value[keep], mpsim_value[keep]
    if name.endswith(".qk_norm.bias"):  # k's beta adds q.beta_k to a whole row of logits, as k's bias does
        dim = d.get("width", kind=int) // d.get("heads", kind=int)
        return torch_value[:dim], mpsim_value[:dim]
    return torch_value, mpsim_value


# ------------------------------------------------------------------ checks

def worst(devs):
    name = max(devs, key=devs.get)
    return devs[name], name


def main(argv):
    if len(argv) != 2:
        print("usage: crosscheck.py DUMP_DIR", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.float32)
    try:
        d = Dump(argv[1])
    except (OSError, ValueError, KeyError) as e:
        print(f"crosscheck: cannot read the dump in {argv[1]}: {e}", file=sys.stderr)
        return 2
    case = d.get("case")
    names = [n for n, _ in d.params]
    print(f"case {case}: {d.get('model')} {d.get('activation')} layer_norm={d.get('layer_norm')} "
          f"optimizer {d.get('optimizer')}, schedule {d.get('schedule')} (warm-up {d.get('warmup')}), "
          f"{d.steps} steps of batch {d.batch}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread")
    print(f"tolerances: local {local_tolerance(d):.2e} (sums along the chain: {reduction_chain(d)}), "
          f"replay {replay_tolerance(d, 0):.2e}*(s+1), free {local_tolerance(d):.2e}*(1+4s^2)")
    print("deviations: |torch - mpsim| / max|mpsim| per tensor (loss: relative); worst tensor of the step;\n"
          "fp64 columns: the same against PyTorch in binary64, for PyTorch's binary32 run and for mpsim's")
    failures = []

    def check(kind, step, what, dev, tol):
        if not (dev <= tol):  # NaN fails too
            failures.append(f"{case}: {kind} check, step {step}, {what}: deviation {dev:.3e} > tolerance {tol:.3e}")

    try:
        # local: PyTorch at mpsim's weights, in binary32 and (for reference) binary64.
        model, model64 = build_model(d), build_model(d).double()
        print("\nlocal: PyTorch forward/backward at mpsim's weights of each step")
        print(f"{'step':>4} {'loss dev':>9} {'grad dev':>9} {'worst tensor':<13} {'tolerance':>9} | "
              f"{'torch-fp64':>10} {'mpsim-fp64':>10}")
        for s in range(d.steps):
            load(model, d.weights[s])
            load(model64, d.weights[s])
            loss, grads = forward_backward(model, d, s)
            _, grads64 = forward_backward(model64, d, s)
            tol = local_tolerance(d)
            ldev = abs(loss - d.losses[s]) / abs(d.losses[s])
            check("local", s, "loss", ldev, tol)
            devs = {n: deviation(grads[n], d.grads[s][n]) for n in names}
            for n in names:
                check("local", s, f"gradient {n}", devs[n], tol)
            dev, name = worst(devs)
            t64, _ = worst({n: deviation(grads[n], grads64[n]) for n in names})
            m64, _ = worst({n: deviation(d.grads[s][n], grads64[n]) for n in names})
            print(f"{s:>4} {ldev:>9.2e} {dev:>9.2e} {name:<13} {tol:>9.2e} | {t64:>10.2e} {m64:>10.2e}")

        # replay: PyTorch's optimiser fed mpsim's gradients.
        model = build_model(d)
        load(model, d.initial)
        params = dict(model.named_parameters())
        optimizer = make_optimizer(d, model.parameters())
        scheduler = make_scheduler(d, optimizer)
        print("\nreplay: PyTorch's optimiser fed mpsim's gradients; the weights after each step")
        print(f"{'step':>4} {'weight dev':>10} {'worst tensor':<13} {'tolerance':>9}")
        for s in range(d.steps):
            for n in names:
                params[n].grad = torch.from_numpy(d.grads[s][n].copy())
            norm = clip(d, model)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            expected = d.weights[s + 1] if s + 1 < d.steps else d.final
            tol = replay_tolerance(d, s)
            devs = {n: deviation(params[n].detach().numpy(), expected[n]) for n in names}
            for n in names:
                check("replay", s, f"weight {n} after the update", devs[n], tol)
            dev, name = worst(devs)
            print(f"{s:>4} {dev:>10.2e} {name:<13} {tol:>9.2e}" +
                  ("" if norm is None else f"   gradient norm {norm:.3f}, clipped to {d.get('clip_norm')}"))

        # free: PyTorch trains on its own, in binary32 and (for reference) binary64.
        model, model64 = build_model(d), build_model(d).double()
        load(model, d.initial)
        load(model64, d.initial)
        optimizer, optimizer64 = make_optimizer(d, model.parameters()), make_optimizer(d, model64.parameters())
        schedulers = [x for x in (make_scheduler(d, optimizer), make_scheduler(d, optimizer64)) if x is not None]
        print("\nfree: PyTorch trains on its own from the same initial weights and batches")
        print(f"{'step':>4} {'loss torch':>10} {'loss mpsim':>10} {'loss dev':>9} {'grad dev':>9} "
              f"{'worst tensor':<13} {'tolerance':>9} | {'torch-fp64':>10} {'mpsim-fp64':>10}")
        for s in range(d.steps):
            loss, grads = forward_backward(model, d, s)
            _, grads64 = forward_backward(model64, d, s)
            tol = free_tolerance(d, s)
            ldev = abs(loss - d.losses[s]) / abs(d.losses[s])
            check("free", s, "loss", ldev, tol)
            devs = {n: deviation(grads[n], d.grads[s][n]) for n in names}
            for n in names:
                check("free", s, f"gradient {n}", devs[n], tol)
            dev, name = worst(devs)
            t64, _ = worst({n: deviation(grads[n], grads64[n]) for n in names})
            m64, _ = worst({n: deviation(d.grads[s][n], grads64[n]) for n in names})
            print(f"{s:>4} {loss:>10.7f} {d.losses[s]:>10.7f} {ldev:>9.2e} {dev:>9.2e} {name:<13} {tol:>9.2e} | "
                  f"{t64:>10.2e} {m64:>10.2e}")
            clip(d, model)
            clip(d, model64)
            optimizer.step()
            optimizer64.step()
            for x in schedulers:
                x.step()
        tol = free_tolerance(d, d.steps)
        devs = {n: deviation(*free_final_values(d, n, p.detach().numpy(), d.final[n]))
                for n, p in model.named_parameters()}
        for n in names:
            check("free", d.steps, f"final weight {n}", devs[n], tol)
        dev, name = worst(devs)
        print(f"final weights: deviation {dev:.2e} ({name}), tolerance {tol:.2e}")
    except (ValueError, RuntimeError) as e:
        print(f"FAIL: {case}: PyTorch could not run the dumped model: {e}")
        return 1

    if failures:
        print(f"\nFAIL: {len(failures)} deviation(s) beyond tolerance:")
        for f in failures[:40]:
            print("  " + f)
        if len(failures) > 40:
            print(f"  ... and {len(failures) - 40} more")
        return 1
    print(f"\nPASS: {case}: mpsim's FP32 training matches PyTorch within rounding tolerances")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
