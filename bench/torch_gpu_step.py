"""bench_gpu's training steps in PyTorch on the GPU (issue #4 §5), timed the same way.

The same models (the MLP of 784-W-...-W-10 with ReLU, LeNet-5), batch sizes and optimiser (SGD, lr 0.05,
momentum 0.9) as bench_gpu, in four modes:
  fp32      torch.backends.cuda.matmul.allow_tf32 = cudnn.allow_tf32 = False
  tf32      both True
  amp-fp16  torch.autocast(float16) + torch.cuda.amp.GradScaler (mpsim's fp16-mixed: dynamic loss scaling)
  amp-bf16  torch.autocast(bfloat16), no scaler (mpsim's bf16-mixed has none)
Like mpsim, every step gathers its batch from host memory (a shuffled permutation of 8 batches of data),
uploads it from pageable memory and reads the loss on the host. Device time per step is measured with
torch.cuda.Event marks after warm-up steps, one mark every --window-steps steps; the figure is the median
over the windows.

Run by bench/gpu_vs_torch.sh with Debian's /usr/bin/python3; nothing imports it.
Usage: /usr/bin/python3 bench/torch_gpu_step.py --out FILE [--mlp-batch 4096] [--mlp-width 4096]
       [--mlp-depth 4] [--cnn-batch 256] [--warmup 10] [--window-steps 10] [--windows 10] [--seed 1]
Prints a Markdown table and writes every figure to FILE (JSON). Exit status 77 when PyTorch sees no CUDA
device (nothing measured). --device cpu --modes fp32,amp-bf16 is a smoke test of the script itself
(host clock instead of events).
"""
import argparse
import datetime
import json
import statistics
import sys
import time

import torch

MODES = ("fp32", "tf32", "amp-fp16", "amp-bf16")
EXIT_NO_DEVICE = 77


def make_model(kind, width, depth):
    nn = torch.nn
    if kind == "mlp":
        layers, features = [nn.Flatten()], 28 * 28
        for _ in range(depth):
            layers += [nn.Linear(features, width), nn.ReLU()]
            features = width
        return nn.Sequential(*layers, nn.Linear(features, 10))
    # LeNet-5 as mpsim builds it (core/src/model.cpp): ReLU and max pooling.
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                         nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


class Marks:
    """Device-time marks: CUDA events on the current stream, or the host clock for --device cpu."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.events, self.host = [], []

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)
        self.host.append(time.perf_counter())

    def intervals_ms(self):
        host = [(b - a) * 1e3 for a, b in zip(self.host, self.host[1:])]
        if not self.cuda:
            return host, host
        self.events[-1].synchronize()
        device = [a.elapsed_time(b) for a, b in zip(self.events, self.events[1:])]
        return device, host


def time_steps(args, device, kind, batch, mode):
    torch.manual_seed(args.seed)
    tf32 = mode == "tf32"
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    model = make_model(kind, args.mlp_width, args.mlp_depth).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    amp_dtype = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}.get(mode)
    scaler = torch.cuda.amp.GradScaler() if mode == "amp-fp16" else None

    generator = torch.Generator().manual_seed(args.seed)
    count = 8 * batch
    images = torch.rand(count, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (count,), generator=generator)
    steps_per_epoch = count // batch
    timed = args.windows * args.window_steps
    marks = Marks(device)
    order = None
    for step in range(args.warmup + timed):
        if step % steps_per_epoch == 0:
            order = torch.randperm(count, generator=generator)
        index = order[(step % steps_per_epoch) * batch:(step % steps_per_epoch + 1) * batch]
        x = images[index].to(device)  # host gather, pageable upload: as mpsim's Batcher and from_host
        y = labels[index].to(device)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
            loss = loss_fn(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        loss.item()  # mpsim reads the loss on the host every step
        since = step + 1 - args.warmup
        if since >= 0 and since % args.window_steps == 0:
            marks.mark()
    device_ms, host_ms = marks.intervals_ms()
    per_step = [ms / args.window_steps for ms in device_ms]
    host_per_step = [ms / args.window_steps for ms in host_ms]
    median = statistics.median(per_step)
    return {"model": kind, "mode": mode, "batch": batch, "median_ms_per_step": median,
            "samples_per_s": batch / (median * 1e-3), "window_ms_per_step": per_step,
            "host_median_ms_per_step": statistics.median(host_per_step), "host_window_ms_per_step": host_per_step,
            "final_loss_scale": scaler.get_scale() if scaler is not None else 1.0}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--mlp-batch", type=int, default=4096)
    parser.add_argument("--mlp-width", type=int, default=4096)
    parser.add_argument("--mlp-depth", type=int, default=4)
    parser.add_argument("--cnn-batch", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--window-steps", type=int, default=10)
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; expected some of {', '.join(MODES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"torch_gpu_step.py: PyTorch {torch.__version__} sees no CUDA device "
              f"(torch.cuda.is_available() is False; built for CUDA {torch.version.cuda}): nothing measured",
              file=sys.stderr)
        return EXIT_NO_DEVICE
    device = torch.device(args.device)
    report = {
        "program": "torch_gpu_step.py",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "results": [],
    }
    for kind, batch in (("mlp", args.mlp_batch), ("cnn", args.cnn_batch)):
        for mode in modes:
            r = time_steps(args, device, kind, batch, mode)
            print(f"torch {kind} {mode}: {r['median_ms_per_step']:.3f} ms/step", file=sys.stderr)
            report["results"].append(r)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"## Training step, PyTorch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {report['cudnn']}) "
          f"on {report['device']}\n")
    print("| model | batch | mode | ms/step | samples/s |")
    print("|---|---|---|---|---|")
    for r in report["results"]:
        print(f"| {r['model']} | {r['batch']} | {r['mode']} | {r['median_ms_per_step']:.3f} | {r['samples_per_s']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
