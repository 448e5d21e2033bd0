"""Offline stand-ins for what accelerate's examples fetch from the Hugging Face Hub.

The examples call ``load_dataset("nyu-mll/glue", "mrpc")`` (or wikitext),
``AutoTokenizer/AutoConfig/AutoModelFor*.from_pretrained(name)`` and
``evaluate.load("glue", "mrpc")``. ``install_*`` replace those with local builds, so an
example runs unchanged with no network:

- GLUE MRPC: a synthetic ``DatasetDict`` (train/validation; sentence1, sentence2, label, idx)
  whose label follows a learnable rule: 1 when sentence2 reuses sentence1's words.
- wikitext: a ``text`` column, most lines empty as in the real set (the autoregressive
  example keeps the first 500 train rows and drops the empty ones).
- tokenizers: word-level ``tokenizers.Tokenizer`` over the stand-in vocabulary, wrapped in
  ``PreTrainedTokenizerFast`` (BERT-style pair template with [CLS]/[SEP]; GPT-style eos).
- models: tiny BERT / GPT-2 configs (hidden 32, 2 layers). The "pretrained" body is built
  under a fixed seed without touching the global RNG; a sequence-classification head is
  then drawn from the global RNG, as ``from_pretrained`` does for a head the checkpoint lacks.
- the metric: accuracy and F1 of the positive class, computed exactly, with evaluate's
  ``add_batch`` / ``compute`` API.

Everything is deterministic: the same call builds the same objects in every process.
"""

from __future__ import annotations

import random
from typing import Any

TRAIN_ROWS = 96
VALIDATION_ROWS = 48
WIKITEXT_TRAIN_ROWS = 520  # the autoregressive example selects range(500)
WIKITEXT_VALIDATION_ROWS = 48
MODEL_SEED = 1234
MAX_LENGTH = 128

_WORDS = [f"w{i}" for i in range(120)]
_BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_EOS = "<|endoftext|>"


def _sentence(rng: random.Random) -> list[str]:
    return rng.sample(_WORDS, rng.randint(5, 9))


def mrpc_rows(count: int, seed: int) -> dict[str, list[Any]]:
    """MRPC-shaped columns: a paraphrase pair (label 1) reuses most of sentence1's words."""
    rng = random.Random(seed)
    columns: dict[str, list[Any]] = {"sentence1": [], "sentence2": [], "label": [], "idx": []}
    for idx in range(count):
        first = _sentence(rng)
        label = rng.randint(0, 1)
        if label:
            second = first[:]
            rng.shuffle(second)
            second[rng.randrange(len(second))] = rng.choice(_WORDS)
        else:
            second = _sentence(rng)
        columns["sentence1"].append(" ".join(first))
        columns["sentence2"].append(" ".join(second))
        columns["label"].append(label)
        columns["idx"].append(idx)
    return columns


def wikitext_rows(count: int, seed: int) -> dict[str, list[str]]:
    """wikitext-shaped lines: one in four has words, the others are empty."""
    rng = random.Random(seed)
    lines = []
    for i in range(count):
        lines.append(" " + " ".join(_sentence(rng) + _sentence(rng)) + " \n" if i % 4 == 1 else "")
    return {"text": lines}


def load_dataset(path: str, name: str | None = None, *args: Any, **kwargs: Any) -> Any:
    """``datasets.load_dataset`` for the two sets the examples name (GLUE MRPC, wikitext)."""
    import datasets

    split = kwargs.get("split")
    if "glue" in path:
        if name not in (None, "mrpc"):
            raise ValueError(f"stand-in load_dataset: GLUE config {name!r} (only 'mrpc')")
        label = datasets.ClassLabel(names=["not_equivalent", "equivalent"])
        features = datasets.Features(
            {
                "sentence1": datasets.Value("string"),
                "sentence2": datasets.Value("string"),
                "label": label,
                "idx": datasets.Value("int32"),
            }
        )
        splits = {
            "train": mrpc_rows(TRAIN_ROWS, seed=1),
            "validation": mrpc_rows(VALIDATION_ROWS, seed=2),
            "test": mrpc_rows(VALIDATION_ROWS, seed=3),
        }
    elif "wikitext" in path:
        features = datasets.Features({"text": datasets.Value("string")})
        splits = {
            "train": wikitext_rows(WIKITEXT_TRAIN_ROWS, seed=4),
            "validation": wikitext_rows(WIKITEXT_VALIDATION_ROWS, seed=5),
            "test": wikitext_rows(WIKITEXT_VALIDATION_ROWS, seed=6),
        }
    else:
        raise ValueError(f"stand-in load_dataset has no offline copy of {path!r}")
    built = datasets.DatasetDict(
        {key: datasets.Dataset.from_dict(rows, features=features) for key, rows in splits.items()}
    )
    if split is not None:
        if split not in built:
            raise ValueError(f"stand-in load_dataset: split {split!r} (has {sorted(built)})")
        return built[split]
    return built


def _causal(name: str) -> bool:
    return "bert" not in str(name).lower()


def tokenizer(name: str = "bert-base-cased", **_: Any) -> Any:
    """A word-level fast tokenizer: BERT-style for ``*bert*`` names, GPT-style otherwise."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if _causal(name):
        vocab = {token: i for i, token in enumerate([_EOS, *_WORDS])}
        core = Tokenizer(models.WordLevel(vocab, unk_token=_EOS))
        core.pre_tokenizer = pre_tokenizers.Whitespace()
        return PreTrainedTokenizerFast(
            tokenizer_object=core,
            bos_token=_EOS,
            eos_token=_EOS,
            unk_token=_EOS,
            model_max_length=MAX_LENGTH,
            model_input_names=["input_ids", "attention_mask"],
        )
    vocab = {token: i for i, token in enumerate([*_BERT_SPECIALS, *_WORDS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=MAX_LENGTH,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def config(name: str = "bert-base-cased", **overrides: Any) -> Any:
    """A tiny BERT (``*bert*`` names) or GPT-2 config: hidden 32, 2 layers, 2 heads."""
    from transformers import BertConfig, GPT2Config

    if _causal(name):
        made: Any = GPT2Config(
            vocab_size=len(_WORDS) + 1,
            n_embd=32,
            n_layer=2,
            n_head=2,
            n_positions=MAX_LENGTH,
            bos_token_id=0,
            eos_token_id=0,
        )
    else:
        made = BertConfig(
            vocab_size=len(_BERT_SPECIALS) + len(_WORDS),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=MAX_LENGTH,
            pad_token_id=0,
        )
    for key, value in overrides.items():
        if hasattr(made, key):
            setattr(made, key, value)
    return made


# from_pretrained's loading options: meaningless for a model built from its config.
_LOADING_OPTIONS = {
    "from_tf",
    "low_cpu_mem_usage",
    "torch_dtype",
    "dtype",
    "cache_dir",
    "revision",
    "trust_remote_code",
    "device_map",
    "attn_implementation",
}


def model(auto_class: Any, name: str, **kwargs: Any) -> Any:
    """``auto_class.from_pretrained(name)``: the tiny model, its body from a fixed seed."""
    import torch

    made_config = kwargs.pop("config", None) or config(name)
    for key, value in kwargs.items():
        if key not in _LOADING_OPTIONS and hasattr(made_config, key):
            setattr(made_config, key, value)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(MODEL_SEED)
        built = auto_class.from_config(made_config)
    head = getattr(built, "classifier", None)
    if isinstance(head, torch.nn.Linear):
        # A head the checkpoint lacks: from_pretrained draws it from the global RNG, the way
        # the model's _init_weights does (normal, std initializer_range; zero bias).
        with torch.no_grad():
            head.weight.normal_(0.0, made_config.initializer_range)
            head.bias.zero_()
    return built


class GlueMrpcMetric:
    """evaluate's ``glue``/``mrpc`` metric: accuracy and F1 of label 1, exact."""

    def __init__(self) -> None:
        self._predictions: list[int] = []
        self._references: list[int] = []

    @staticmethod
    def _ints(values: Any) -> list[int]:
        values = values.tolist() if hasattr(values, "tolist") else values
        return [int(v) for v in values]

    def add_batch(self, *, predictions: Any = None, references: Any = None) -> None:
        self._predictions += self._ints(predictions)
        self._references += self._ints(references)

    def add(self, *, prediction: Any = None, reference: Any = None) -> None:
        self.add_batch(predictions=[prediction], references=[reference])

    def compute(self, *, predictions: Any = None, references: Any = None) -> dict[str, float]:
        if predictions is not None:
            self.add_batch(predictions=predictions, references=references)
        preds, refs = self._predictions, self._references
        self._predictions, self._references = [], []
        pairs = list(zip(preds, refs, strict=True))
        tp = sum(1 for p, r in pairs if p == 1 and r == 1)
        fp = sum(1 for p, r in pairs if p == 1 and r == 0)
        fn = sum(1 for p, r in pairs if p == 0 and r == 1)
        accuracy = sum(1 for p, r in pairs if p == r) / len(pairs) if pairs else 0.0
        f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
        return {"accuracy": float(accuracy), "f1": float(f1)}


def load_metric(path: str, config_name: str | None = None, *args: Any, **kwargs: Any) -> Any:
    """``evaluate.load("glue", "mrpc")``."""
    if path == "glue" and config_name == "mrpc":
        return GlueMrpcMetric()
    raise ValueError(f"stand-in evaluate.load has no offline copy of {path!r}/{config_name!r}")
