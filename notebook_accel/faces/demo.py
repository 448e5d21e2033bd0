"""A demo launch: a small regression MLP trained on 2 CPU processes with the Accelerator.

Run it with ``python -m notebook_accel.demo`` (``--processes N``, ``--precision bf16``).
"""

from __future__ import annotations

import argparse
from typing import Any


def train(epochs: int = 3, lr: float = 0.05) -> dict[str, Any]:
    """Train a two-layer MLP on synthetic data; returns this rank's view of the run."""
    import torch

    from .. import Accelerator, set_seed, tqdm

    accelerator = Accelerator()
    set_seed(0)
    x = torch.randn(2048, 16)
    y = x @ torch.randn(16, 1) + 0.1 * torch.randn(2048, 1)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True
    )
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    losses = []
    for epoch in range(epochs):
        total = torch.zeros(1)
        for xb, yb in tqdm(data, desc=f"epoch {epoch}"):
            with accelerator.autocast():
                loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            total += loss.detach().float()
        mean = accelerator.reduce(total / len(data), "mean").item()
        losses.append(mean)
        accelerator.print(f"epoch {epoch}: mean loss {mean:.4f}")
    return {"rank": accelerator.process_index, "batches": len(data), "losses": losses}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--precision", default="no", choices=["no", "bf16", "fp16"])
    parser.add_argument("--epochs", type=int, default=3)
    options = parser.parse_args(argv)
    from .. import notebook_launcher

    results = notebook_launcher(
        train,
        args=(options.epochs,),
        num_processes=options.processes,
        mixed_precision=options.precision,
        hardware="cpu",
    )
    for result in results:
        print(result)
    first, last = results[0]["losses"][0], results[0]["losses"][-1]
    print(f"loss {first:.4f} -> {last:.4f} on {len(results)} processes")
    return 0 if last < first else 1


if __name__ == "__main__":
    raise SystemExit(main())
