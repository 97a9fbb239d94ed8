"""Shared fixtures: tiny language models built from a config, with a tokenizer trained in-process.

Nothing here downloads anything. The tiny models are real transformers models (Llama-style causal LM,
BERT-style masked LM) with random weights; they are small enough that a forward pass takes
milliseconds, so tests can exercise the whole path (tokenise, score, generate, perturb, step).
"""
from __future__ import annotations

import os
import pathlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"

CORPUS = [
    "It was great . It was terrible . the movie was good and the acting was bad .",
    "Does this mean that the premise is true ? Yes or No ? Maybe so .",
    "Title : Context : Question : Answer : Passage : the answer is 42 .",
    "In the previous sentence , does the pronoun refer to the man ? Yes , No .",
    "Suppose we can infer that the cat sat on the mat . Yes , No , or Maybe ?",
    "Description Expression Entity Human Location Number : what is the capital of France ?",
    "so because the sun rose early and the people went outside to play in the park .",
    "0 1 2 3 4 5 6 7 8 9 a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z ' \" , . ? ! : ; ( ) -",
]


def _train_tokenizer(mask: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<unk>"] + (["<mask>"] if mask else [])
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    kwargs = dict(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    if mask:
        kwargs["mask_token"] = "<mask>"
    return PreTrainedTokenizerFast(**kwargs)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A byte-level BPE tokenizer (vocab ~400) trained in-process on a small corpus."""
    return _train_tokenizer(mask=False)


@pytest.fixture(scope="session")
def tiny_mlm_tokenizer():
    return _train_tokenizer(mask=True)


def make_tiny_causal_lm(tokenizer, seed: int = 0, **overrides):
    """A 2-layer Llama-style causal LM with random weights (about 60k parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    cfg.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    model.eval()
    return model


def make_tiny_masked_lm(tokenizer, seed: int = 0):
    """A 2-layer BERT-style masked LM with random weights."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = BertForMaskedLM(cfg)
    model.eval()
    return model


@pytest.fixture()
def tiny_causal_lm(tiny_tokenizer):
    """(model, tokenizer): a fresh tiny causal LM for each test (tests may change its weights)."""
    return make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer


@pytest.fixture()
def tiny_masked_lm(tiny_mlm_tokenizer):
    return make_tiny_masked_lm(tiny_mlm_tokenizer), tiny_mlm_tokenizer


@pytest.fixture(scope="session")
def shared_data_dir():
    """The real datasets beside the checkout (../shared/data); tests that need them skip without it."""
    env = os.environ.get("MEZO_RL_DATA")
    path = pathlib.Path(env) if env else SHARED_DATA
    if not path.is_dir():
        pytest.skip(f"real data directory not found at {path} (set MEZO_RL_DATA)")
    return path
