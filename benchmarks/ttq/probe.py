"""The machine-speed probe: ``python -m ttq.probe [SECONDS]`` prints this machine's fp32 matrix
product rate in GFLOP/s (:func:`gflops`), for ``ttq.runner.machine_gflops``, which runs it in a
fresh process after every run."""

from __future__ import annotations

import statistics
import sys
import time

import torch

SECONDS = 0.5  # how long a probe times its products, unless told


def gflops(seconds: float) -> float:
    """The median rate of fp32 512 x 512 matrix products on the CPU (torch, its default threads)
    over ``seconds`` of them (at least 3), in GFLOP/s (2 x 512^3 per product)."""
    a, b = torch.rand(512, 512), torch.rand(512, 512)
    torch.mm(a, b)
    rates = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(rates) < 3:
        start = time.perf_counter()
        torch.mm(a, b)
        rates.append(2 * 512**3 / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


def main(argv: list[str]) -> int:
    """Print :func:`gflops` over ``argv[0]`` seconds (:data:`SECONDS` without it)."""
    print(f"{gflops(float(argv[0]) if argv else SECONDS):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
