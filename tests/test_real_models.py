"""Real models from transformers (issue 28), built from tiny configs with random weights (no
downloads); skipped where transformers is not installed. For each: ``fpx.interval`` holds the
model's own output and its float64 run; layer-by-layer ``fpx.classify`` says roundoff against
the float64 copy and bug -- at that layer -- against a copy with one Linear's weight scaled by
1.01; ``fpx.stochastic`` runs. The classify tests are slow (each exports every layer).
torchvision and timm are not tested here: the torchvision release for torch 2.13 (0.28.0) is on
PyPI only as a CUDA build whose ``_C.so`` needs ``libtorch_cuda.so``, so beside the CPU torch
``import torchvision`` fails ("operator torchvision::nms does not exist"), and timm imports
torchvision."""
from __future__ import annotations

import copy
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")

import fpx  # noqa: E402
from _real_model_checks import (assert_classify_finds_a_planted_weight,  # noqa: E402
                                assert_samples_scatter_about)

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning"),
              # T5's position buckets cast log(0) = -inf to int64 on the side a where() drops
              pytest.mark.filterwarnings("ignore:invalid value encountered in cast")]
logging.getLogger("transformers").setLevel(logging.ERROR)

VOCAB, SEQ = 64, 8


def _gpt2():
    return T.GPT2Model(T.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32,
                                    vocab_size=VOCAB, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
                                    use_cache=False, bos_token_id=0, eos_token_id=0)), \
        "h.1.mlp.c_fc"


def _bert():
    return T.BertModel(T.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=64,
                                    max_position_embeddings=32, hidden_dropout_prob=0,
                                    attention_probs_dropout_prob=0),
                       add_pooling_layer=False), "encoder.layer.1.intermediate.dense"


def _llama():
    return T.LlamaModel(T.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1,
                                      intermediate_size=64, max_position_embeddings=32,
                                      use_cache=False)), "layers.1.mlp.up_proj"


def _t5():
    return T.T5EncoderModel(T.T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64,
                                       num_layers=2, num_heads=2, dropout_rate=0,
                                       relative_attention_num_buckets=8,
                                       relative_attention_max_distance=16)), \
        "encoder.block.1.layer.1.DenseReluDense.wi"


MODELS = {"gpt2": _gpt2, "bert": _bert, "llama": _llama, "t5_encoder": _t5}


def _model(name):
    torch.manual_seed(0)
    m, layer = MODELS[name]()
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    return m.eval(), layer, ids


def _hidden(m):
    return lambda ids: m(ids).last_hidden_state


@pytest.mark.parametrize("name", sorted(MODELS))
def test_interval_holds_the_models_output_and_its_float64_run(name):
    m, _, ids = _model(name)
    iv = fpx.interval(_hidden(m))(ids)
    with torch.no_grad():
        own = m(ids).last_hidden_state
        f64 = copy.deepcopy(m).double()(ids).last_hidden_state
    assert np.isfinite(iv.lo).all() and np.isfinite(iv.hi).all()
    assert iv.contains(own.double()).all() and iv.contains(f64).all()
    # fpx's value: one result round-off could produce (its kernels, not always torch's bits)
    assert iv.contains(iv.value.double()).all()
    assert torch.allclose(iv.value, own, rtol=1e-4, atol=1e-5)
    # the model called directly returns its ModelOutput container of intervals
    out = fpx.interval(m)(ids)
    assert isinstance(out, T.utils.ModelOutput) and out.last_hidden_state.contains(own).all()


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "bert" else n
                                  for n in sorted(MODELS)])      # (bert: ~10 s, the slow run)
def test_stochastic_runs_scatter_about_the_output(name):
    m, _, ids = _model(name)
    s = fpx.stochastic(_hidden(m), "sr", samples=4, seed=0)(ids)
    with torch.no_grad():
        own = m(ids).last_hidden_state
    assert_samples_scatter_about(s, own, 4)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_classify_layer_by_layer_roundoff_and_a_planted_bug(name):
    m, layer, ids = _model(name)
    assert_classify_finds_a_planted_weight(m, layer, ids)
