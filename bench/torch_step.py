"""A training step in PyTorch (CPU), timed like bench_train: the default MLP's FP32 step (SGD with momentum,
batch 128), or with --model gpt the charlm GPT's (core/src/model.cpp's `gpt`: 4 pre-LayerNorm causal blocks of
width 128, 4 heads, GELU MLP of 512, learned position table, untied head; AdamW; batch 32 of context 128 over
96 symbols).

Usage: OPENBLAS_NUM_THREADS=T /usr/bin/python3 bench/torch_step.py --threads T [--repetitions 5] [--model gpt]
Prints one JSON line: {"threads": T, "median_ms": ..., "runs_ms": [...]}.
"""
import argparse
import json
import math
import statistics
import time

import torch
from torch import nn

CONTEXT, VOCABULARY, WIDTH, HEADS, MLP, DEPTH = 128, 96, 128, 4, 512, 4


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


def setup(model_name, steps):
    """The model, its optimiser, and `steps` batches of inputs and labels."""
    if model_name == "gpt":
        model = Gpt()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
        inputs = torch.randint(0, VOCABULARY, (steps, 32, CONTEXT))
        labels = torch.randint(0, VOCABULARY, (steps, 32 * CONTEXT))
        return model, optimizer, inputs, labels
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, optimizer, torch.rand(steps, 128, 1, 28, 28), torch.randint(0, 10, (steps, 128))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--model", choices=("mlp", "gpt"), default="mlp")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    warmup, timed = (2, 6) if args.model == "gpt" else (10, 60)  # as bench_train
    model, optimizer, inputs, labels = setup(args.model, warmup + timed)
    loss_fn = nn.CrossEntropyLoss()
    runs = []
    for _ in range(args.repetitions):
        for step in range(warmup + timed):
            if step == warmup:
                start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs[step]), labels[step])
            loss.backward()
            optimizer.step()
            loss.item()  # as mpsim reads the loss every step
        runs.append((time.perf_counter() - start) / timed * 1e3)
    print(json.dumps({"threads": args.threads, "median_ms": statistics.median(runs), "runs_ms": runs}))


if __name__ == "__main__":
    main()
