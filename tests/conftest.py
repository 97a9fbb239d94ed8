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
DATA = pathlib.Path(__file__).resolve().parent / "data"  # made-up rows per task (see data_dir)

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


@pytest.fixture
def one_thread():
    """torch on one thread for the test: the same reduction order in every pass it compares; small tensors run
    faster so, and immune to OpenMP stalls on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


@pytest.fixture()
def tiny_model_dir(tmp_path, tiny_tokenizer):
    """A tiny causal LM saved with save_pretrained, for `--model DIR` on the command line."""
    path = tmp_path / "tiny-model"
    make_tiny_causal_lm(tiny_tokenizer).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def data_dir():
    """tests/data: a data directory laid out like the real one (``<TASK>/<file>`` as tasks/builtin.py reads
    them, and ``LM-BFF-k-shot/``), holding a few dozen made-up rows per task, so the fast suite runs the
    whole path from files to prompts everywhere."""
    return DATA


@pytest.fixture()
def shared_data_dir(request):
    """The real datasets ($MEZO_RL_DATA, else ../shared/data beside the checkout), for tests marked slow
    only (a fast test uses ``data_dir``); skips where they are absent."""
    if request.node.get_closest_marker("slow") is None:
        pytest.fail(f"{request.node.nodeid} reads the real data: mark it slow or use the data_dir fixture (tests/data)")
    env = os.environ.get("MEZO_RL_DATA")
    path = pathlib.Path(env) if env else SHARED_DATA
    if not path.is_dir():
        pytest.skip(f"real data directory not found at {path} (set MEZO_RL_DATA)")
    return path


# ---------------------------------------------------------------------------- float32 tolerances
FLOAT32_UNIT_ROUNDOFF = torch.finfo(torch.float32).eps / 2  # u = 2**-24


def float32_rounding_bound(magnitude, n_terms: int) -> float:
    """A first-order worst-case bound on the float32 rounding error of a value of size ``magnitude``
    computed through a chain of reductions (dot products, softmax sums) of ``n_terms`` terms in all.

    Summing n terms in floating point errs by at most gamma_n * sum|x_i|, gamma_n = n*u / (1 - n*u)
    (Higham, *Accuracy and Stability of Numerical Algorithms*, eq. 3.5); to first order the relative
    errors of chained reductions add, so n is the total over the chain. Two float32 computations of
    the same value that differ only in summation order (another batch size or padding, another BLAS
    blocking or thread count) both lie within this bound of the exact value, hence within twice it
    of each other: callers comparing two float32 results use ``2 *``. ``magnitude`` stands for
    sum|x_i| and should be at least the size of the compared values.
    """
    gamma = n_terms * FLOAT32_UNIT_ROUNDOFF / (1 - n_terms * FLOAT32_UNIT_ROUNDOFF)
    return gamma * float(magnitude)


def model_reduction_terms(model, seq_len: int) -> int:
    """Total reduction length along one forward pass of a transformer, for :func:`float32_rounding_bound`.

    Per layer: two norms, the q/k/v and output projections (hidden size each), the attention scores
    (head size), the softmax and the weighted sum over ``seq_len`` positions, the MLP's up and down
    projections (hidden size, MLP width). Then the final norm, the output head and the log-softmax
    over the vocabulary.
    """
    cfg = model.config
    h, width = cfg.hidden_size, getattr(cfg, "intermediate_size", 4 * cfg.hidden_size)
    head = h // cfg.num_attention_heads
    per_layer = 2 * h + 2 * h + head + 2 * seq_len + h + width
    return cfg.num_hidden_layers * per_layer + 2 * h + cfg.vocab_size


def assert_float32_close(actual, expected, model, seq_len: int, extra_terms: int = 0) -> None:
    """``actual`` and ``expected``, two float32 results of ``model``'s forward on inputs of at most
    ``seq_len`` tokens that differ only in summation order, agree within twice the rounding bound
    (``extra_terms``: further summed terms on top of one forward, e.g. the tokens of a log-likelihood)."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected, dtype=torch.as_tensor(actual).dtype)
    magnitude = max(float(actual.abs().max()), float(expected.abs().max()))
    tol = 2 * float32_rounding_bound(magnitude, model_reduction_terms(model, seq_len) + extra_terms)
    torch.testing.assert_close(actual, expected, atol=tol, rtol=0)
