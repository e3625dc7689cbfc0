"""The default MLP's FP32 training step in PyTorch (CPU), timed like bench_train.

Usage: OPENBLAS_NUM_THREADS=T /usr/bin/python3 bench/torch_step.py --threads T [--repetitions 5]
Prints one JSON line: {"threads": T, "median_ms": ..., "runs_ms": [...]}.
"""
import argparse
import json
import statistics
import time

import torch

BATCH, WARMUP, TIMED = 128, 10, 60


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    images = torch.rand(WARMUP + TIMED, BATCH, 1, 28, 28)
    labels = torch.randint(0, 10, (WARMUP + TIMED, BATCH))
    runs = []
    for _ in range(args.repetitions):
        for step in range(WARMUP + TIMED):
            if step == WARMUP:
                start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(images[step]), labels[step])
            loss.backward()
            optimizer.step()
            loss.item()  # as mpsim reads the loss every step
        runs.append((time.perf_counter() - start) / TIMED * 1e3)
    print(json.dumps({"threads": args.threads, "median_ms": statistics.median(runs), "runs_ms": runs}))


if __name__ == "__main__":
    main()
