"""The harness that runs accelerate's examples on both frameworks: its pieces.

Not the example runs themselves (minutes each): the pieces they stand on. The Hub stand-ins
are checked in a fresh process with only the harness' PYTHONPATH and the network off, the way
every run gets them; the import rewrite, the output parser and the verdicts on text.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "accelerate_examples", BENCHMARKS / "accelerate_examples.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# Runs in a fresh interpreter: the stand-ins arrive through sitecustomize, as in a run.
_PROBE = r"""
import json, torch, evaluate
from datasets import load_dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer
import sitecustomize

data = load_dataset("nyu-mll/glue", "mrpc")
tokenizer = AutoTokenizer.from_pretrained("bert-base-cased")
pair = tokenizer(data["train"]["sentence1"][:1], data["train"]["sentence2"][:1])
metric = evaluate.load("glue", "mrpc")
metric.add_batch(predictions=torch.tensor([1, 1, 0, 0]), references=torch.tensor([1, 0, 1, 0]))
first = metric.compute()
metric.add_batch(predictions=[1, 1, 1], references=[1, 1, 0])

def build():
    torch.manual_seed(42)
    model = AutoModelForSequenceClassification.from_pretrained("bert-base-cased", return_dict=True)
    return sitecustomize.weights_digest(model.state_dict()), torch.rand(1).item()

(digest_a, after_a), (digest_b, after_b) = build(), build()
torch.manual_seed(42)
torch.empty(2, 32).normal_(0, 0.02)  # the head's draw, nothing else
print(json.dumps({
    "splits": {k: [v.num_rows, v.column_names] for k, v in data.items()},
    "labels": sorted(set(data["train"]["label"])),
    "tokens": tokenizer.convert_ids_to_tokens(pair["input_ids"][0]),
    "type_ids": sorted(set(pair["token_type_ids"][0])),
    "first": first, "second": metric.compute(),
    "digests": [digest_a, digest_b], "after": [after_a, after_b, torch.rand(1).item()],
}))
"""


@pytest.mark.slow
def test_hub_standins_build_offline_and_the_same_in_every_process(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(BENCHMARKS / "hub_standins"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
    }
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    columns = ["sentence1", "sentence2", "label", "idx"]
    assert got["splits"] == {
        "train": [96, columns],
        "validation": [48, columns],
        "test": [48, columns],
    }
    assert got["labels"] == [0, 1]
    tokens = got["tokens"]
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2 and tokens[-1] == "[SEP]"
    assert got["type_ids"] == [0, 1]
    # tp 1, fp 1, fn 1: accuracy 2/4, f1 2/4; then a fresh count: 2 of 3 right, f1 4/5
    assert got["first"] == {"accuracy": 0.5, "f1": 0.5}
    assert got["second"] == {"accuracy": 2 / 3, "f1": 0.8}
    digest_a, digest_b = got["digests"]
    assert digest_a == digest_b  # the same model each time
    # The global RNG moved by the head's draw only: as much as one normal_ of its shape.
    assert got["after"][0] == got["after"][1] == got["after"][2]


def test_rewrite_touches_the_imports_only() -> None:
    rewrite = _harness().rewrite
    text = (
        "from accelerate import Accelerator\n"
        "    from accelerate.utils import set_seed\n"
        "import accelerate.logging\n"
        "import accelerated_thing\n"
        "x = 'from accelerate import y'  # accelerate stays here\n"
    )
    assert rewrite(text) == (
        "from notebook_accel import Accelerator\n"
        "    from notebook_accel.utils import set_seed\n"
        "import notebook_accel.logging\n"
        "import accelerated_thing\n"
        "x = 'from accelerate import y'  # accelerate stays here\n"
    )


def _run(harness: ModuleType, text: str, error: str | None = None) -> object:
    metrics, weights = harness.parse_output(text)
    return harness.Run(0, 1.0, metrics, weights, error=error)


def test_output_parsing_and_verdicts() -> None:
    harness = _harness()
    out = (
        "[rank 0] epoch 0: {'accuracy': 0.75, 'f1': 0.8}\n"
        "[rank 1] =====  tensor([0, 1])\n"
        "epoch 0 - update step 3:: grad norm: 1.25 ::train loss: 4.5\n"
        "epoch 0:: eval perplexity: 90.0 eval_loss: 4.49980974197\n"
        "epoch 0:: eval perplexity: 90.0 eval_loss: 4.49980974197\n"  # a second log handler
        "[rank 0] @@harness weights abc123\n"
    )
    metrics, weights = harness.parse_output(out)
    assert metrics == [
        ("epoch 0", {"accuracy": 0.75, "f1": 0.8}),
        ("epoch 0 step 3", {"grad_norm": 1.25, "train_loss": 4.5}),
        ("epoch 0", {"perplexity": 90.0, "eval_loss": 4.49980974197}),
    ]
    assert weights == "abc123"
    ref = _run(harness, out)
    assert harness.verdict(ref, _run(harness, out)) == "same"
    near = out.replace("4.5\n", "4.50004\n")  # 1e-5 relative: a loss within tolerance
    assert harness.verdict(ref, _run(harness, near)) == "same"
    other = out.replace("'accuracy': 0.75", "'accuracy': 0.7500011")
    assert harness.verdict(ref, _run(harness, other)).startswith("differs (epoch 0: accuracy")
    moved = out.replace("abc123", "def456")
    assert harness.verdict(ref, _run(harness, moved)) == "differs (weights)"
    broken = _run(harness, "", error="AttributeError: no gradient_accumulation_steps setter")
    assert harness.verdict(ref, broken) == (
        "fails (ours: AttributeError: no gradient_accumulation_steps setter)"
    )


def test_error_line_skips_the_launchers_wrappers() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "x.py", line 3, in <module>\n'
        "[rank 1] ImportError: cannot import name 'ProfileKwargs' from 'notebook_accel.utils'\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    )
    line = _harness().error_line(text)
    assert line == "ImportError: cannot import name 'ProfileKwargs' from 'notebook_accel.utils'"
