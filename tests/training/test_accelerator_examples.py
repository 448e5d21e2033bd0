"""accelerate-style code runs with only the import changed (the "four lines" pattern).

The examples below are written for HF accelerate; the test swaps the import line, and nothing
else, then runs them on 2 processes.
"""

from __future__ import annotations

import textwrap

import torch

from notebook_accel import debug_launcher

FOUR_LINES = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from accelerate import Accelerator

    def main(dataset, model):
        accelerator = Accelerator()
        device = accelerator.device
        model = model.to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        data = torch.utils.data.DataLoader(dataset, shuffle=True, batch_size=8)
        model, optimizer, data = accelerator.prepare(model, optimizer, data)
        model.train()
        losses = []
        for epoch in range(8):
            for source, targets in data:
                source = source.to(device)
                targets = targets.to(device)
                optimizer.zero_grad()
                output = model(source)
                loss = F.cross_entropy(output, targets)
                accelerator.backward(loss)
                optimizer.step()
                losses.append(loss.item())
        return losses
    """
)

FULL_LOOP = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from accelerate import Accelerator

    def main(dataset, model, folder):
        accelerator = Accelerator(gradient_accumulation_steps=2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=20)
        train = torch.utils.data.DataLoader(dataset, shuffle=True, batch_size=4)
        evaluation = torch.utils.data.DataLoader(dataset, batch_size=5)
        model, optimizer, train, evaluation, scheduler = accelerator.prepare(
            model, optimizer, train, evaluation, scheduler
        )
        for epoch in range(4):
            model.train()
            for source, targets in train:
                with accelerator.accumulate(model):
                    loss = F.cross_entropy(model(source), targets)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
            model.eval()
            correct, seen = 0, 0
            for source, targets in evaluation:
                with torch.no_grad():
                    predictions = model(source).argmax(dim=-1)
                predictions, targets = accelerator.gather_for_metrics((predictions, targets))
                correct += (predictions == targets).sum().item()
                seen += targets.numel()
            accelerator.print(f"epoch {epoch}: accuracy {correct / seen:.2f}")
        accelerator.wait_for_everyone()
        accelerator.save_state(folder)
        unwrapped = accelerator.unwrap_model(model)
        accelerator.save_model(unwrapped, folder)
        accelerator.end_training()
        return correct / seen, seen, scheduler.get_last_lr()[0]
    """
)


def _ported(source: str) -> str:
    ported = source.replace("from accelerate import", "from notebook_accel import")
    changed = [a for a, b in zip(source.splitlines(), ported.splitlines(), strict=True) if a != b]
    assert changed == ["from accelerate import Accelerator"]
    return ported


def _dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(62, 4, generator=g)  # 62: not a multiple of the global batch
    return torch.utils.data.TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long())


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))


def _run_examples(four_lines: str, full_loop: str, folder: str) -> tuple:
    first: dict = {}
    exec(four_lines, first)
    second: dict = {}
    exec(full_loop, second)
    return first["main"](_dataset(), _model()), second["main"](_dataset(), _model(), folder)


def test_accelerate_examples_run_with_only_the_import_changed(tmp_path: object) -> None:
    folder = str(tmp_path)
    ranks = debug_launcher(
        _run_examples, args=(_ported(FOUR_LINES), _ported(FULL_LOOP), folder), num_processes=2
    )
    for losses, (accuracy, seen, lr) in ranks:
        assert sum(losses[-4:]) < 0.5 * sum(losses[:4])
        assert accuracy > 0.85 and seen == 62  # evaluated on exactly the 62 samples
        assert lr < 1e-2  # the schedule moved, once per optimizer step
    assert ranks[0][1] == ranks[1][1]
