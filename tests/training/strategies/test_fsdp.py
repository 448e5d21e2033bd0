"""FSDP through the Accelerator on real processes (gloo): equivalence with DDP, shard sizes,
sharded checkpoints (2 -> 2 and 2 -> 1 processes), full-state export and bad input.

Launches are few and each groups several checks (a launch plus FSDP's setup costs seconds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import debug_launcher
from notebook_accel.errors import CheckpointError, ConfigError
from notebook_accel.training.process import DistributedType, ProcessState
from notebook_accel.training.strategies.sharder import FsdpConfig, Sharder, wrap_targets


class Block(torch.nn.Module):
    calls = 0  # forwards run, recomputations included

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        Block.calls += 1
        return x + torch.tanh(self.fc(x))


def make_model() -> torch.nn.Sequential:
    # Odd sizes: dim 0 does not split evenly in two, so FSDP's padding is exercised.
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 15), Block(15), Block(15), torch.nn.Linear(15, 3))


def make_loader() -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=g)
    y = x @ torch.randn(6, 3, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole, on every rank (DTensor shards gathered)."""
    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name.replace("module.", "")] = t.detach().clone()
    return out


def train(fsdp: Any, accumulation: int = 1, steps: int = 8) -> dict[str, Any]:
    """Train with AdamW created BEFORE prepare (as accelerate users do), clipping included."""
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(gradient_accumulation_steps=accumulation, fsdp=fsdp)
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    model, opt, loader = acc.prepare(model, opt, make_loader())
    norms, losses, skipped = [], [], []
    for i, (x, y) in enumerate(loader):
        if i == steps * accumulation:
            break
        with acc.accumulate(model):
            loss = F.mse_loss(model(x), y)
            acc.backward(loss)
            if fsdp and not acc.sync_gradients:
                # Not resharded after backward: the module holds its gathered (plain) weights,
                # and their gradients are each rank's own, not reduced.
                params = list(model.parameters())
                grad = acc.gather(params[0].grad[None])
                gathered = all(type(p).__name__ != "DTensor" for p in params)
                skipped.append(gathered and not torch.equal(grad[0], grad[1]))
            if acc.sync_gradients:
                norms.append(float(acc.clip_grad_norm_(model.parameters(), 0.5)))
            opt.step()
            opt.zero_grad()
        losses.append(float(acc.reduce(loss.detach(), "mean")))
    out: dict[str, Any] = {"weights": full_weights(model), "norms": norms, "losses": losses}
    out["skipped"] = skipped
    if fsdp:
        local = sum(p.to_local().numel() for p in model.parameters())
        state = [t for s in opt.state.values() for t in s.values() if t.dim() > 0]
        out["local_params"] = local
        out["local_state"] = sum(t.to_local().numel() for t in state)
        out["total_params"] = sum(p.numel() for p in model.parameters())
        out["state_total"] = sum(t.numel() for t in state)
        out["opt_holds_shards"] = all(
            type(p).__name__ == "DTensor" for g in opt.param_groups for p in g["params"]
        )
    return out


def _equivalence_runs() -> dict[str, Any]:
    wrap = {"auto_wrap_classes": ["Block"]}
    return {
        "ddp": train(None),
        "ddp_acc": train(None, accumulation=2, steps=4),
        "full": train({"sharding_strategy": "full", **wrap}),
        "grad_op": train({"sharding_strategy": "grad_op", "min_num_params": 100}),
        "full_acc": train({"sharding_strategy": "full", **wrap}, accumulation=2, steps=4),
        "grad_op_acc": train("grad_op", accumulation=2, steps=4),
        "no_shard": train("no_shard"),
        "offload": train({"cpu_offload": True, **wrap}),
    }


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


def test_fsdp_matches_ddp_and_shards_state() -> None:
    ranks = debug_launcher(_equivalence_runs, num_processes=2)
    for result in ranks:
        ddp, ddp_acc = result["ddp"], result["ddp_acc"]
        for name, ref in [
            ("full", ddp),
            ("grad_op", ddp),
            ("no_shard", ddp),
            ("offload", ddp),
            ("full_acc", ddp_acc),
            ("grad_op_acc", ddp_acc),
        ]:
            run = result[name]
            _close(run["weights"], ref["weights"])
            # The clipped norm is the global one: the same as DDP's full-gradient norm.
            assert run["norms"] == pytest.approx(ref["norms"], rel=1e-5), name
            assert run["losses"] == pytest.approx(ref["losses"], rel=1e-5), name
            assert run["opt_holds_shards"], name
        assert max(ddp["norms"]) > 0.5  # clipping was really active
    for name in ("full", "grad_op", "full_acc"):
        # Each rank holds about half of the parameters and of AdamW's moments.
        shares = [r[name]["local_params"] / r[name]["total_params"] for r in ranks]
        states = [r[name]["local_state"] / r[name]["state_total"] for r in ranks]
        assert sum(r[name]["local_params"] for r in ranks) == ranks[0][name]["total_params"]
        assert all(0.4 < s < 0.6 for s in shares + states), (name, shares, states)
    for name in ("full_acc", "grad_op_acc"):
        assert all(all(r[name]["skipped"]) for r in ranks) and len(ranks[0][name]["skipped"]) == 4
    # no_shard replicates: every rank holds everything.
    assert all(r["no_shard"]["local_params"] == r["no_shard"]["total_params"] for r in ranks)


# ---- accelerate 1.16's FSDP2 -------------------------------------------------------------
def _checkpointed(offload: bool) -> tuple[dict[str, Any], int]:
    wrap = {"auto_wrap_classes": ["Block"], "activation_checkpointing": True}
    before = Block.calls
    run = train({**wrap, "activation_checkpointing_offload": offload}, steps=4)
    return run, Block.calls - before


def _fsdp2_116() -> dict[str, Any]:
    from notebook_accel.training.accelerator import Accelerator

    out: dict[str, Any] = {}
    before = Block.calls
    out["plain"] = train({"auto_wrap_classes": ["Block"]}, steps=4)
    out["plain_calls"] = Block.calls - before
    out["ac"], out["ac_calls"] = _checkpointed(offload=False)
    out["ac_offload"], out["ac_offload_calls"] = _checkpointed(offload=True)

    # a model prepared alone (evaluation), then its outputs are the unsharded model's
    acc = Accelerator(fsdp={"auto_wrap_classes": ["Block"]})
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(acc.process_index))
    expected = make_model()(x)
    alone = acc.prepare(make_model())
    with torch.no_grad():
        out["eval_equal"] = torch.allclose(alone(x), expected, atol=1e-6)

    # clipping: by value (allowed with FSDP2 in 1.16), by norm 2, inf and 0 (shards whole)
    model = acc.prepare(make_model())
    grads_zero = next(iter(model.parameters()))
    loss = F.mse_loss(model(x), torch.zeros(4, 3))
    acc.backward(loss)
    grads_zero.grad.zero_()  # a gradient with no non-zero entry: norm 0 counts the others
    whole = [p.grad.full_tensor() for p in model.parameters()]
    out["norms"] = [
        (
            float(acc.clip_grad_norm_(model.parameters(), 1e9, norm_type=t)),
            float(torch.nn.utils.get_total_norm(whole, t)),
        )
        for t in (2.0, float("inf"), 0.0)
    ]
    acc.clip_grad_value_(model.parameters(), 1e-4)
    out["clamped"] = max(float(p.grad.to_local().abs().max()) for p in model.parameters())
    return out


def test_fsdp2_as_accelerate_116_checkpoints_evaluates_and_clips() -> None:
    for rank in debug_launcher(_fsdp2_116, num_processes=2):
        plain = rank["plain"]
        for name in ("ac", "ac_offload"):
            # the same training, the blocks' forwards run again in backward (2 blocks,
            # 4 steps: 8 forwards, 8 recomputations)
            _close(rank[name]["weights"], plain["weights"])
            assert rank[name]["losses"] == pytest.approx(plain["losses"], rel=1e-6)
            assert (rank["plain_calls"], rank[f"{name}_calls"]) == (8, 16)
        assert rank["eval_equal"]
        for ours, whole in rank["norms"]:
            assert ours == pytest.approx(whole, rel=1e-6)
        assert rank["norms"][2][0] == 7.0  # 8 gradients, one all zeros
        assert rank["clamped"] <= 1e-4


# ---- checkpoints -------------------------------------------------------------------------
def _steps(acc: Any, model: Any, opt: Any, batches: list[Any]) -> None:
    for x, y in batches:
        acc.backward(F.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()


def _batches(rank: int, start: int, count: int) -> list[Any]:
    g = torch.Generator().manual_seed(100 + start)
    out = []
    for _ in range(start + count):
        x = torch.randn(2, 4, 6, generator=g)
        out.append((x[rank], (x[rank] @ torch.ones(6, 3))))
    return out[start:]


def _save_run(folder: str) -> dict[str, Any]:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(fsdp={"auto_wrap_classes": ["Block"]})
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    _steps(acc, model, opt, _batches(acc.process_index, 0, 3))
    at_save = full_weights(model)
    acc.save_state(Path(folder) / "ckpt")
    acc.save_model(model, Path(folder) / "export")
    exported = acc.get_state_dict(model)
    _steps(acc, model, opt, _batches(acc.process_index, 3, 3))
    return {"at_save": at_save, "final": full_weights(model), "exported_keys": sorted(exported)}


def _resume_run(folder: str) -> dict[str, Any]:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(fsdp={"auto_wrap_classes": ["Block"]})
    model = make_model()
    torch.nn.init.zeros_(model[0].weight)  # type: ignore[arg-type]  # the load must overwrite
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    try:  # a plain (DDP-style) checkpoint: a clear error, not a silent mismatch
        acc.load_state(Path(folder) / "plain")
        error = ""
    except CheckpointError as err:
        error = str(err)
    acc.load_state(Path(folder) / "ckpt")
    _steps(acc, model, opt, _batches(acc.process_index, 3, 3))
    return {"weights": full_weights(model), "error": error}


def test_sharded_checkpoint_resumes_in_two_and_loads_in_one(tmp_path: Path) -> None:
    from notebook_accel.training.accelerator import Accelerator

    saved = debug_launcher(_save_run, args=(str(tmp_path),), num_processes=2)
    assert (tmp_path / "ckpt" / "sharded" / ".metadata").is_file()
    assert not list(tmp_path.glob(".ckpt.*"))  # the staging folder was renamed into place
    assert saved[0]["exported_keys"] and saved[1]["exported_keys"] == []
    # One process, a plain module: DCP reshards the two ranks' shards into whole tensors.
    acc = Accelerator()
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    acc.save_state(tmp_path / "plain")
    acc.load_state(tmp_path / "ckpt")
    _close(full_weights(model), saved[0]["at_save"])
    assert all(len(s) == 3 for s in opt.state.values())  # step, exp_avg, exp_avg_sq restored

    # save_model's export is a plain full state dict.
    plain = make_model()
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "export" / "model.safetensors")
    plain.load_state_dict(weights)
    _close(full_weights(plain), saved[0]["at_save"])

    resumed = debug_launcher(_resume_run, args=(str(tmp_path),), num_processes=2)
    for rank in range(2):
        _close(resumed[rank]["weights"], saved[0]["final"])  # exact resume after 3 more steps
        assert "was saved without FSDP" in resumed[rank]["error"]


# ---- bad input ---------------------------------------------------------------------------
def _state(world: int) -> ProcessState:
    return ProcessState(0, 0, world, world, torch.device("cpu"), "gloo", DistributedType.NO)


def test_bad_input_names_the_option() -> None:
    from notebook_accel.training.accelerator import Accelerator

    with pytest.raises(ConfigError, match="fsdp") as one:
        Accelerator(fsdp="full")  # this test process is a single process
    assert "2 processes" in str(one.value)
    with pytest.raises(ConfigError) as strategy:
        FsdpConfig(sharding_strategy="zero3")  # type: ignore[arg-type]
    assert strategy.value.parameter == "fsdp.sharding_strategy"
    assert "'grad_op'" in strategy.value.accepted
    with pytest.raises(ConfigError) as cls:
        wrap_targets(make_model(), FsdpConfig(auto_wrap_classes=("Blok",)))
    assert cls.value.parameter == "fsdp.auto_wrap_classes" and cls.value.value == "Blok"
    assert "Block" in cls.value.accepted
    with pytest.raises(ConfigError) as hybrid:
        Sharder(FsdpConfig(sharding_strategy="hybrid"), _state(2))
    assert hybrid.value.parameter == "fsdp.hybrid_shard_size"
    with pytest.raises(ConfigError, match=r"fsdp\['sharding'\]"):
        FsdpConfig.coerce({"sharding": "full"})
    with pytest.raises(ConfigError, match="fsdp.param_dtype"):
        FsdpConfig(param_dtype="fp8")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="fsdp.min_num_params"):
        FsdpConfig(min_num_params=-1)


def test_config_forms_and_wrap_targets() -> None:
    assert FsdpConfig.coerce(None) is None and FsdpConfig.coerce("no") is None
    assert FsdpConfig.coerce("grad_op") == FsdpConfig(sharding_strategy="grad_op")
    config = FsdpConfig(auto_wrap_classes=["Block"], min_num_params=50)  # type: ignore[arg-type]
    assert FsdpConfig.coerce(config.to_option()) == config
    model = make_model()
    # Innermost first. By size: the first Linear (105 >= 50 parameters) and each Block's fc
    # (240); a Block left with no parameters of its own is not a unit; the last Linear (48) is
    # left to the root.
    assert wrap_targets(model, config) == [model[0], model[1].fc, model[2].fc]
    assert wrap_targets(model, FsdpConfig(auto_wrap_classes=("Block",))) == [model[1], model[2]]
    assert wrap_targets(model, FsdpConfig()) == []
    assert Sharder(FsdpConfig("hybrid", hybrid_shard_size=2), _state(4)).mesh_shape == (2, 2)
    assert Sharder(FsdpConfig("no_shard"), _state(2)).mesh_shape == (2, 1)


def _hybrid_and_bf16_runs() -> dict[str, Any]:
    from notebook_accel.training.accelerator import Accelerator

    out: dict[str, Any] = {
        "ddp": train(None, steps=4),
        "hybrid": train({"sharding_strategy": "hybrid", "hybrid_shard_size": 2}, steps=4),
    }
    # bf16: autocast from the Accelerator plus FSDP's bf16 gathers and fp32 reductions.
    acc = Accelerator(mixed_precision="bf16", fsdp={"param_dtype": "bf16", "reduce_dtype": "fp32"})
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt, make_loader())
    losses = []
    for _ in range(3):
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(acc.gather(loss.detach()[None]).mean().item())
    # per epoch (4 steps): a single batch's loss depends on which samples the shuffle put there
    out["bf16_losses"] = [sum(losses[:4]) / 4, sum(losses[-4:]) / 4]
    return out


def test_hybrid_on_four_processes_and_bf16() -> None:
    ranks = debug_launcher(_hybrid_and_bf16_runs, num_processes=4)
    for result in ranks:
        _close(result["hybrid"]["weights"], result["ddp"]["weights"])
        first, last = result["bf16_losses"]
        assert last < 0.8 * first, (first, last)  # 12 steps of bf16 training lower the loss
    # Sharded within pairs, replicated across them: each rank holds about half.
    share = ranks[0]["hybrid"]["local_params"] / ranks[0]["hybrid"]["total_params"]
    assert 0.4 < share < 0.6
