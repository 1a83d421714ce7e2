"""A zoo of models nobody here wrote, called as their users call them (issue 44).

Each builder ``name(no_dropout=False)`` returns ``(model, inputs)``: a
``torch.nn.Module`` in eval mode with random weights (``torch.manual_seed(0)``;
transformers models from tiny configs: hidden 32, 2 layers; nothing is
downloaded) and ``inputs(batch, size, seed=0)``, which makes the ``(args,
kwargs)`` of a call, ``model(*args, **kwargs)``, for a batch: ``inputs(2)`` is the first example (sequence 8, image
32 x 32), ``inputs(3, other_size=True)`` a call of another sequence length
(11) or image size (40). Models whose inputs cannot change size (learned
position tables of a fixed length: ViT, CLIP, Whisper; a LayerNorm over
[C, H, W]) keep theirs.

``no_dropout=True`` builds the model with every dropout-like randomness off
(see :func:`_no_dropout`), so that it trains deterministically.

``ZOO = {name: builder}``. Adapted from the issue-44 survey of what exports.
"""
from __future__ import annotations

import torch
from torch import nn

VOCAB = 100
_DROPOUT_WORDS = ("dropout", "pdrop", "layerdrop", "drop_path", "mask_time_prob",
                  "mask_feature_prob")


def _no_dropout(cfg):
    """``cfg`` with every float attribute whose name holds one of
    _DROPOUT_WORDS set to 0 (dropout, attention/hidden/classifier dropout,
    GPT-2's *_pdrop, layer drop, stochastic depth, wav2vec2's masking)."""
    for key, value in list(vars(cfg).items()):
        if isinstance(value, float) and any(w in key for w in _DROPOUT_WORDS):
            setattr(cfg, key, 0.0)
    return cfg


def _seq(other_size):
    return 11 if other_size else 8


def _gen(seed, offset):
    return torch.Generator().manual_seed(1000 * seed + offset)


def _ids(b, s, seed, low=0):
    return torch.randint(low, VOCAB, (b, s), dtype=torch.int64, generator=_gen(seed, 1))


def _mask(b, s):
    m = torch.ones(b, s, dtype=torch.int64)
    m[-1, s - s // 3:] = 0  # the last sequence is padded
    return m


def _pixels(b, size, ch=3, seed=0):
    return torch.randn(b, ch, size, size, generator=_gen(seed, 2))


def _text(*, kwargs=True, mask=True, low=0, **extra):
    """inputs(batch): input_ids (positional or keyword), attention_mask."""
    def inputs(b=2, other_size=False, seed=0):
        s = _seq(other_size)
        ids = _ids(b, s, seed, low)
        kw = dict(attention_mask=_mask(b, s)) if mask else {}
        kw.update(extra)
        return ((), dict(input_ids=ids, **kw)) if kwargs else ((ids,), kw)
    return inputs


def _image(*, fixed=None, ch=3, keyword=True):
    """inputs(batch): pixel_values (keyword) or x (positional)."""
    def inputs(b=2, other_size=False, seed=0):
        x = _pixels(b, fixed or (40 if other_size else 32), ch, seed)
        return ((), dict(pixel_values=x)) if keyword else ((x,), {})
    return inputs


def _built(model, inputs):
    return model.eval(), inputs


_TXT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64)


def _cfg(cls, no_dropout, **kw):
    torch.manual_seed(0)
    cfg = cls(**kw)
    return _no_dropout(cfg) if no_dropout else cfg


# ---------------------------------------------------------------- transformers: text
def bert_cls_mask(no_dropout=False):
    from transformers import BertConfig, BertForSequenceClassification
    cfg = _cfg(BertConfig, no_dropout, **_TXT, num_labels=3)
    return _built(BertForSequenceClassification(cfg), _text())


def bert_cls_mask_eager(no_dropout=False):
    from transformers import BertConfig, BertForSequenceClassification
    cfg = _cfg(BertConfig, no_dropout, **_TXT, num_labels=3, attn_implementation="eager")
    return _built(BertForSequenceClassification(cfg), _text())


def bert_model_nomask(no_dropout=False):
    from transformers import BertConfig, BertModel
    cfg = _cfg(BertConfig, no_dropout, **_TXT)
    return _built(BertModel(cfg), _text(kwargs=False, mask=False))


def bert_model_token_types(no_dropout=False):
    from transformers import BertConfig, BertModel
    cfg = _cfg(BertConfig, no_dropout, **_TXT)
    text = _text()

    def inputs(b=2, other_size=False, seed=0):
        args, kw = text(b, other_size, seed)
        tt = torch.zeros_like(kw["input_ids"])
        tt[:, tt.shape[1] // 2:] = 1
        return args, dict(kw, token_type_ids=tt)
    return _built(BertModel(cfg), inputs)


def distilbert_cls(no_dropout=False):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    cfg = _cfg(DistilBertConfig, no_dropout, vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4,
               hidden_dim=64, max_position_embeddings=64, num_labels=2)
    return _built(DistilBertForSequenceClassification(cfg), _text())


def albert_model(no_dropout=False):
    from transformers import AlbertConfig, AlbertModel
    cfg = _cfg(AlbertConfig, no_dropout, **_TXT, embedding_size=16)
    return _built(AlbertModel(cfg), _text())


def roberta_cls(no_dropout=False):
    from transformers import RobertaConfig, RobertaForSequenceClassification
    cfg = _cfg(RobertaConfig, no_dropout, **_TXT, num_labels=2)
    # ids >= 3 keep clear of the pad id (1), which shifts RoBERTa's positions
    return _built(RobertaForSequenceClassification(cfg), _text(low=3))


def electra_cls(no_dropout=False):
    from transformers import ElectraConfig, ElectraForSequenceClassification
    cfg = _cfg(ElectraConfig, no_dropout, **_TXT, embedding_size=16, num_labels=2)
    return _built(ElectraForSequenceClassification(cfg), _text())


_GPT2 = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
             eos_token_id=0)


def gpt2_lm(no_dropout=False):
    """As a user calls it: the default use_cache=True returns past_key_values."""
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = _cfg(GPT2Config, no_dropout, **_GPT2)
    return _built(GPT2LMHeadModel(cfg), _text(kwargs=False, mask=False))


def gpt2_lm_nocache(no_dropout=False):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = _cfg(GPT2Config, no_dropout, **_GPT2)
    return _built(GPT2LMHeadModel(cfg), _text(use_cache=False))


def gpt2_model(no_dropout=False):
    """GPT2Model(input_ids), use_cache=False in its config, no attention_mask."""
    from transformers import GPT2Config, GPT2Model
    cfg = _cfg(GPT2Config, no_dropout, **_GPT2, use_cache=False)
    return _built(GPT2Model(cfg), _text(kwargs=False, mask=False))


_LLAMA = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def llama_lm(no_dropout=False):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = _cfg(LlamaConfig, no_dropout, **_LLAMA)
    return _built(LlamaForCausalLM(cfg), _text())


def llama_lm_nocache(no_dropout=False):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = _cfg(LlamaConfig, no_dropout, **_LLAMA)
    return _built(LlamaForCausalLM(cfg), _text(use_cache=False))


def llama_lm_nocache_nomask(no_dropout=False):
    """Without attention_mask, transformers looks for packed sequences in the
    position ids (torch.diff)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = _cfg(LlamaConfig, no_dropout, **_LLAMA)
    return _built(LlamaForCausalLM(cfg), _text(mask=False, use_cache=False))


def _t5(no_dropout, **kw):
    from transformers import T5Config, T5EncoderModel
    cfg = _cfg(T5Config, no_dropout, vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
               num_layers=2, num_heads=4, **kw)
    return _built(T5EncoderModel(cfg), _text())


def t5_encoder(no_dropout=False):
    return _t5(no_dropout)


def t5_encoder_eager(no_dropout=False):
    return _t5(no_dropout, attn_implementation="eager")


# ---------------------------------------------------------------- transformers: vision
def vit_cls(no_dropout=False):
    from transformers import ViTConfig, ViTForImageClassification
    cfg = _cfg(ViTConfig, no_dropout, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8,
               num_labels=5)
    return _built(ViTForImageClassification(cfg), _image(fixed=32))


def _swin(no_dropout, **kw):
    from transformers import SwinConfig, SwinForImageClassification
    cfg = _cfg(SwinConfig, no_dropout, image_size=32, patch_size=4, embed_dim=16,
               depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=5, **kw)
    return _built(SwinForImageClassification(cfg), _image())


def swin_cls(no_dropout=False):
    return _swin(no_dropout)


def swin_cls_eager(no_dropout=False):
    return _swin(no_dropout, attn_implementation="eager")


def convnext_cls(no_dropout=False):
    from transformers import ConvNextConfig, ConvNextForImageClassification
    cfg = _cfg(ConvNextConfig, no_dropout, hidden_sizes=[8, 16], depths=[1, 1],
               num_stages=2, image_size=32, num_labels=5)
    return _built(ConvNextForImageClassification(cfg), _image())


def resnet_cls(no_dropout=False):
    from transformers import ResNetConfig, ResNetForImageClassification
    cfg = _cfg(ResNetConfig, no_dropout, embedding_size=8, hidden_sizes=[8, 16],
               depths=[1, 1], layer_type="basic", num_labels=5)
    return _built(ResNetForImageClassification(cfg), _image())


def mobilenetv2_cls(no_dropout=False, init=0.3):
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    # the default initializer_range (0.02) makes the logits ~1e-26: a test of nothing
    cfg = _cfg(MobileNetV2Config, no_dropout, image_size=32, depth_multiplier=0.25,
               finegrained_output=False, num_labels=5, initializer_range=init)
    return _built(MobileNetV2ForImageClassification(cfg), _image())


def clip_vision(no_dropout=False):
    from transformers import CLIPVisionConfig, CLIPVisionModel
    cfg = _cfg(CLIPVisionConfig, no_dropout, hidden_size=32, intermediate_size=64,
               num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)
    return _built(CLIPVisionModel(cfg), _image(fixed=32))


# ---------------------------------------------------------------- transformers: audio
def _whisper_cfg(no_dropout):
    from transformers import WhisperConfig
    return _cfg(WhisperConfig, no_dropout, vocab_size=VOCAB, num_mel_bins=16, d_model=32,
                encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                max_source_positions=16, max_target_positions=16, classifier_proj_size=16,
                num_labels=3, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                decoder_start_token_id=3)


def _mel(b=2, other_size=False, seed=0):
    # Whisper takes exactly 2 * max_source_positions frames
    return (), dict(input_features=torch.randn(b, 16, 32, generator=_gen(seed, 3)))


def whisper_encoder(no_dropout=False):
    """WhisperModel's encoder, called as model.get_encoder()(input_features)."""
    from transformers import WhisperModel
    cfg = _whisper_cfg(no_dropout)
    return _built(WhisperModel(cfg).get_encoder(), _mel)


def whisper_audio_cls(no_dropout=False):
    from transformers import WhisperForAudioClassification
    cfg = _whisper_cfg(no_dropout)
    return _built(WhisperForAudioClassification(cfg), _mel)


def wav2vec2_model(no_dropout=False):
    from transformers import Wav2Vec2Config, Wav2Vec2Model
    cfg = _cfg(Wav2Vec2Config, no_dropout, vocab_size=VOCAB, hidden_size=32,
               num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
               conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
               num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)

    def inputs(b=2, other_size=False, seed=0):  # 50 samples a step
        n = 50 * _seq(other_size)
        return (), dict(input_values=torch.randn(b, n, generator=_gen(seed, 4)))
    return _built(Wav2Vec2Model(cfg), inputs)


# ---------------------------------------------------------------- plain torch
class BagClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(VOCAB, 16, mode="mean")
        self.fc = nn.Linear(16, 3)

    def forward(self, text, offsets):
        return self.fc(self.bag(text, offsets))


def embeddingbag_mean(no_dropout=False):
    torch.manual_seed(0)

    def inputs(b=2, other_size=False, seed=0):  # b bags of about s tokens each
        s = 5 if other_size else 4
        text = torch.randint(0, VOCAB, (b * s + 1,), generator=_gen(seed, 5))
        return (text, torch.arange(b, dtype=torch.int64) * s), {}
    return _built(BagClassifier(), inputs)


class RNNTagger(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        rnn = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = rnn(16, 24, num_layers=2, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(48, 5)

    def forward(self, x):
        out, _ = self.rnn(self.emb(x))
        return self.fc(out)


def lstm_tagger(no_dropout=False):
    torch.manual_seed(0)
    return _built(RNNTagger("lstm"), _text(kwargs=False, mask=False))


def gru_tagger(no_dropout=False):
    torch.manual_seed(0)
    return _built(RNNTagger("gru"), _text(kwargs=False, mask=False))


class TinyTransformer(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=dropout, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = nn.Linear(32, 2)

    def forward(self, x, src_key_padding_mask=None):
        h = self.enc(self.emb(x), src_key_padding_mask=src_key_padding_mask)
        return self.fc(h.mean(1))


def transformer_encoder(no_dropout=False):
    torch.manual_seed(0)
    return _built(TinyTransformer(0.0 if no_dropout else 0.1),
                  _text(kwargs=False, mask=False))


def transformer_encoder_padmask(no_dropout=False):
    torch.manual_seed(0)

    def inputs(b=2, other_size=False, seed=0):
        s = _seq(other_size)
        return (_ids(b, s, seed),), dict(src_key_padding_mask=_mask(b, s) == 0)
    return _built(TinyTransformer(0.0 if no_dropout else 0.1), inputs)


class MHA(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, dropout=dropout, batch_first=True)

    def forward(self, q, kv, key_padding_mask):
        out, weights = self.attn(q, kv, kv, key_padding_mask=key_padding_mask)
        return out, weights


def mha_keypad(no_dropout=False):
    torch.manual_seed(0)

    def inputs(b=2, other_size=False, seed=0):  # 4 queries, s keys
        s = _seq(other_size)
        g = _gen(seed, 6)
        q, kv = torch.randn(b, 4, 32, generator=g), torch.randn(b, s, 32, generator=g)
        return (q, kv, _mask(b, s) == 0), {}
    return _built(MHA(0.0), inputs)


class UNet(nn.Module):
    def __init__(self, c=8):
        super().__init__()

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(),
                                 nn.Conv2d(o, o, 3, padding=1), nn.ReLU())

        self.d1, self.d2, self.mid = block(3, c), block(c, 2 * c), block(2 * c, 4 * c)
        self.pool = nn.MaxPool2d(2)
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.u2 = block(4 * c, 2 * c)
        self.up1 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.u1 = block(2 * c + c, c)
        self.head = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        s1 = self.d1(x)
        s2 = self.d2(self.pool(s1))
        m = self.mid(self.pool(s2))
        y = self.u2(torch.cat([self.up2(m), s2], 1))
        y = self.u1(torch.cat([self.up1(y), s1], 1))
        return self.head(y)


def unet(no_dropout=False):
    torch.manual_seed(0)
    return _built(UNet(), _image(keyword=False))


class ConvAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.dec = nn.Sequential(
            nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
            nn.ConvTranspose2d(8, 1, 3, stride=2, padding=1, output_padding=1), nn.Sigmoid())

    def forward(self, x):
        return self.dec(self.enc(x))


def convtranspose_ae(no_dropout=False):
    torch.manual_seed(0)
    return _built(ConvAE(), _image(ch=1, keyword=False))


class NormNet(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        if kind == "group":
            self.norm = nn.GroupNorm(4, 8)
        elif kind == "instance":
            self.norm = nn.InstanceNorm2d(8, affine=True)
        else:
            self.norm = nn.LayerNorm([8, 32, 32])
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x)))
        return self.fc(h.mean((2, 3)))


def groupnorm_net(no_dropout=False):
    torch.manual_seed(0)
    return _built(NormNet("group"), _image(keyword=False))


def instancenorm_net(no_dropout=False):
    torch.manual_seed(0)
    return _built(NormNet("instance"), _image(keyword=False))


def layernorm_net(no_dropout=False):
    torch.manual_seed(0)
    return _built(NormNet("layer"), _image(fixed=32, keyword=False))


ZOO = {f.__name__: f for f in [
    bert_cls_mask, bert_cls_mask_eager, bert_model_nomask, bert_model_token_types,
    distilbert_cls, albert_model, roberta_cls, electra_cls,
    gpt2_lm, gpt2_lm_nocache, gpt2_model, llama_lm, llama_lm_nocache, llama_lm_nocache_nomask,
    t5_encoder, t5_encoder_eager,
    vit_cls, swin_cls, swin_cls_eager, convnext_cls, resnet_cls, mobilenetv2_cls, clip_vision,
    whisper_encoder, whisper_audio_cls, wav2vec2_model,
    embeddingbag_mean, lstm_tagger, gru_tagger, transformer_encoder,
    transformer_encoder_padmask, mha_keypad, unet, convtranspose_ae,
    groupnorm_net, instancenorm_net, layernorm_net,
]}
