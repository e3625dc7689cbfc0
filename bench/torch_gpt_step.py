"""The charlm GPT's FP32 training step in PyTorch (CPU), timed like bench_train_gpt.

The model of core/src/model.cpp's `gpt` (4 pre-LayerNorm causal blocks of width 128, 4 heads, GELU MLP of 512,
learned position table, untied head), AdamW, batch 32 of context 128 over 96 symbols.
Usage: OPENBLAS_NUM_THREADS=T /usr/bin/python3 bench/torch_gpt_step.py --threads T [--repetitions 3]
Prints one JSON line: {"threads": T, "median_ms": ..., "runs_ms": [...]}.
"""
import argparse
import json
import math
import statistics
import time

import torch
from torch import nn

BATCH, CONTEXT, VOCABULARY, WIDTH, HEADS, MLP, DEPTH = 32, 128, 96, 128, 4, 512, 4
WARMUP, TIMED = 2, 6


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.qkv, self.proj = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, MLP), nn.Linear(MLP, WIDTH)
        self.register_buffer("mask", torch.ones(CONTEXT, CONTEXT, dtype=torch.bool).triu(1))

    def forward(self, x):
        b, t, w = x.shape
        d = w // HEADS
        q, k, v = (p.reshape(b, t, HEADS, d).transpose(1, 2) for p in self.qkv(self.ln1(x)).split(w, -1))
        s = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(self.mask, float("-inf"))
        x = x + self.proj((s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, w))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, WIDTH)
        self.pos = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        self.blocks = nn.Sequential(*[Block() for _ in range(DEPTH)])
        self.ln, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCABULARY)

    def forward(self, ids):
        return self.head(self.ln(self.blocks(self.embed(ids) + self.pos))).reshape(-1, VOCABULARY)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    model = Gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    loss_fn = nn.CrossEntropyLoss()
    ids = torch.randint(0, VOCABULARY, (WARMUP + TIMED, BATCH, CONTEXT))
    labels = torch.randint(0, VOCABULARY, (WARMUP + TIMED, BATCH * CONTEXT))
    runs = []
    for _ in range(args.repetitions):
        for step in range(WARMUP + TIMED):
            if step == WARMUP:
                start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(ids[step]), labels[step])
            loss.backward()
            optimizer.step()
            loss.item()
        runs.append((time.perf_counter() - start) / TIMED * 1e3)
    print(json.dumps({"threads": args.threads, "median_ms": statistics.median(runs), "runs_ms": runs}))


if __name__ == "__main__":
    main()
