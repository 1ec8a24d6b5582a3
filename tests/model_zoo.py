"""Small real models from torchvision, timm and transformers, built from configs with random init.

Nothing is downloaded (``HF_HUB_OFFLINE=1``; no pretrained weights). Each entry of ``MODELS`` is a
``ZooModel``: a builder returning ``(model, example_inputs)`` and how to turn the output into one
tensor to differentiate. ``import_torchvision()`` & co. return the library or None when it is not
installed, so tests can skip cleanly.

torchvision's C extension (``torchvision::nms``...) does not load against every torch build; its
Python modules still work, but importing them registers fake kernels for ``torchvision::nms`` and
``torchvision::qnms``, which fails unless the ops exist. ``_define_torchvision_ops`` defines their
schemas with ``torch.library`` first (only when the C ops are missing), as the real extension would.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
from pathlib import Path
from typing import Any, Callable

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

_torchvision_lib = None  # keeps the torch.library.Library alive (its definitions die with it)


def _define_torchvision_ops() -> None:
    """Define the schemas torchvision's Python code registers fake kernels for, if its C ops are absent."""
    global _torchvision_lib
    try:
        torch.ops.torchvision.nms  # noqa: B018  (raises when the op does not exist)
        return
    except (AttributeError, RuntimeError):
        pass
    # not registered yet: load torchvision's C extension as its own import would; only where that
    # fails (a build for another torch or CUDA) are the schemas defined here (defining them first
    # would make a loadable extension abort on the duplicate registration)
    spec = importlib.util.find_spec("torchvision")
    for location in (spec.submodule_search_locations or []) if spec else []:
        for lib in sorted(Path(location).glob("_C*.so")):
            try:
                torch.ops.load_library(str(lib))
                return
            except (OSError, RuntimeError):
                pass
    if _torchvision_lib is None:
        _torchvision_lib = torch.library.Library("torchvision", "DEF")
        _torchvision_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _torchvision_lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _import(name: str):
    try:
        importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if importlib.util.find_spec(name) is None:
        return None
    _define_torchvision_ops()
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def import_torchvision():
    """``torchvision`` (its models), or None when it is not installed."""
    return _import("torchvision")


def import_timm():
    return _import("timm")


def import_transformers():
    mod = _import("transformers")
    if mod is not None:
        mod.logging.set_verbosity_error()
    return mod


@dataclasses.dataclass
class ZooModel:
    name: str
    library: str  # "torchvision" / "timm" / "transformers": the test skips when it is missing
    build: Callable[[Any], tuple[torch.nn.Module, tuple]]  # (library module) -> (model, example inputs)
    loss: Callable[[Any], torch.Tensor] = None  # output -> tensor to backprop (default: first tensor)
    train: bool = True  # train mode (BatchNorm running stats, dropout off via configs)

    def make(self):
        lib = {"torchvision": import_torchvision, "timm": import_timm,
               "transformers": import_transformers}[self.library]()
        if lib is None:
            return None
        torch.manual_seed(0)
        model, inputs = self.build(lib)
        model.train(self.train)
        return model, inputs


def first_tensor(out) -> torch.Tensor:
    """The first tensor of a model output (a tensor, tuple, or transformers ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        out = list(out.values())
    for item in out:
        if isinstance(item, torch.Tensor):
            return item
        if isinstance(item, (tuple, list, dict)):
            t = first_tensor(item)
            if t is not None:
                return t
    return None


def flat_tensors(out) -> list[torch.Tensor]:
    """Every tensor of a (nested) model output, in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in flat_tensors(item)]
    return []


def _image(n=2, c=3, hw=32):
    return (torch.randn(n, c, hw, hw),)


def _tokens(vocab=99, batch=2, seq=8):
    return torch.randint(1, vocab, (batch, seq))


# ---- torchvision ---------------------------------------------------------------------------------
def _resnet18(tv):
    from torchvision.models.resnet import BasicBlock, ResNet

    return ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10), _image()  # ResNet-18's blocks, one per stage


def _mobilenet_v2(tv):
    # 64x64 images, 4 of them: at 32x32 the last batch norm normalises 2 values per channel (a 1x1
    # map, batch 2), whose output is +-1 whatever its input, so every gradient before it is rounding
    # noise (eager float32's is 10x its own norm away from float64's)
    return tv.models.mobilenet_v2(num_classes=10, width_mult=0.25, dropout=0.0), _image(n=4, hw=64)


def _mobilenet_v3(tv):
    return tv.models.mobilenet_v3_small(num_classes=10, width_mult=0.25, dropout=0.0), _image()


def _efficientnet_b0(tv):
    """EfficientNet-B0's stages at half width. 64x64 images in batches of 4: its last stages see 2x2 maps,
    so BatchNorm's batch statistics are over 16 values (over 2 values, at 1x1, tiny rounding differences
    are amplified past any tolerance, eager against eager with another summation order)."""
    from torchvision.models.efficientnet import EfficientNet, MBConvConfig

    b0 = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
          (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]
    setting = [MBConvConfig(*row, width_mult=0.5, depth_mult=1.0) for row in b0]
    return EfficientNet(setting, dropout=0.0, stochastic_depth_prob=0.0, num_classes=10), _image(n=4, hw=64)


def _regnet(tv):
    from torchvision.models.regnet import BlockParams, RegNet

    params = BlockParams.from_init_params(depth=3, w_0=8, w_a=8.0, w_m=2.0, group_width=8)
    return RegNet(params, num_classes=10), _image()


def _convnext(tv):
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    settings = [CNBlockConfig(16, 32, 1), CNBlockConfig(32, 64, 1), CNBlockConfig(64, None, 1)]
    return ConvNeXt(settings, stochastic_depth_prob=0.0, num_classes=10), _image()


# ---- timm ----------------------------------------------------------------------------------------
def _timm_vit(timm):
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10), _image()


def _timm_convnext(timm):
    from timm.models.convnext import ConvNeXt

    return ConvNeXt(depths=(1, 1, 1, 1), dims=(8, 16, 32, 64), num_classes=10), _image()


# ---- transformers ---------------------------------------------------------------------------------
_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=99,
             max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _bert(tr):
    model = tr.BertModel(tr.BertConfig(**_TINY, attn_implementation="eager"))
    return model, (_tokens(),)


def _gpt2(tr):
    cfg = tr.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=99, n_positions=64, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    return tr.GPT2LMHeadModel(cfg), (_tokens(),)


def _llama(tr):
    cfg = tr.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=99, max_position_embeddings=64, use_cache=False)
    return tr.LlamaForCausalLM(cfg), (_tokens(),)


def _t5(tr):
    cfg = tr.T5Config(d_model=32, d_kv=16, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2, vocab_size=99,
                      dropout_rate=0.0, use_cache=False)
    ids = _tokens()
    return tr.T5Model(cfg), (ids, None, ids[:, :4])  # input_ids, attention_mask, decoder_input_ids


def _bart(tr):
    cfg = tr.BartConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=99,
                        max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                        use_cache=False)
    return tr.BartModel(cfg), (_tokens(),)


def _bart_cache(tr):
    """BART as ``BartModel(config)`` gives it: ``use_cache`` on, so the decoder builds its key/value
    cache (transformers copies the config for it and renames the decoder's keys on the copy)."""
    model, inputs = _bart(tr)
    model.config.use_cache = True
    return model, inputs


def _vit_hf(tr):
    cfg = tr.ViTConfig(image_size=32, patch_size=8, num_channels=3, **{k: v for k, v in _TINY.items()
                                                                         if k not in ("vocab_size", "max_position_embeddings")})
    return tr.ViTModel(cfg, add_pooling_layer=False), _image()


def _whisper(tr):
    cfg = tr.WhisperConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                           decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=99,
                           num_mel_bins=8, max_source_positions=16, max_target_positions=16, dropout=0.0,
                           use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    return tr.WhisperModel(cfg), (torch.randn(2, 8, 32), None, _tokens(seq=4))  # features, mask, decoder ids


MODELS: list[ZooModel] = [
    ZooModel("resnet18", "torchvision", _resnet18),
    ZooModel("mobilenet_v2", "torchvision", _mobilenet_v2),
    ZooModel("mobilenet_v3_small", "torchvision", _mobilenet_v3),
    ZooModel("efficientnet_b0", "torchvision", _efficientnet_b0),
    ZooModel("regnet", "torchvision", _regnet),
    ZooModel("convnext_tv", "torchvision", _convnext),
    ZooModel("vit_timm", "timm", _timm_vit),
    ZooModel("convnext_timm", "timm", _timm_convnext),
    ZooModel("bert", "transformers", _bert),
    ZooModel("gpt2", "transformers", _gpt2),
    ZooModel("llama", "transformers", _llama),
    ZooModel("t5", "transformers", _t5),
    ZooModel("bart", "transformers", _bart),
    ZooModel("bart_cache", "transformers", _bart_cache, train=False),
    ZooModel("vit_hf", "transformers", _vit_hf),
    ZooModel("whisper", "transformers", _whisper),
]

BY_NAME = {m.name: m for m in MODELS}


# ---- a wider sweep (not in CI): more architectures of the same libraries, for `python -m tests.test_real_models
# --extra`. Each is still built from a config with random weights, at a size that runs in seconds on a CPU.
def _tv(fn_name, **kwargs):
    def build(tv):
        return getattr(tv.models, fn_name)(num_classes=10, **kwargs), _image()
    return build


def _densenet(tv):
    from torchvision.models.densenet import DenseNet

    return DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2, num_classes=10), _image()


def _resnext(tv):
    from torchvision.models.resnet import Bottleneck, ResNet

    return ResNet(Bottleneck, [1, 1, 1, 1], groups=4, width_per_group=4, num_classes=10), _image()


def _swin_tv(tv):
    from torchvision.models.swin_transformer import SwinTransformer

    return SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=[4, 4],
                           stochastic_depth_prob=0.0, num_classes=10), _image()


def _vit_tv(tv):
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                             num_classes=10), _image()


def _timm(name, hw=32, **kwargs):
    def build(timm):
        return timm.create_model(name, pretrained=False, num_classes=10, **kwargs), _image(hw=hw)
    return build


def _hf(config_cls, model_cls, inputs=None, **cfg):
    """A transformers model from ``config_cls(**cfg)``; the input is a batch of token ids unless given."""
    def build(tr):
        config = getattr(tr, config_cls)(**cfg)
        config._attn_implementation = "eager" if config_cls in _EAGER_ATTENTION else "sdpa"
        return getattr(tr, model_cls)(config), (inputs() if inputs else (_tokens(),))
    return build


_EAGER_ATTENTION = {"DebertaV2Config", "GPTNeoConfig", "BloomConfig", "ConvNextConfig"}  # no SDPA path in transformers


def _ids_and_decoder_ids():
    ids = _tokens()
    return ids, None, ids[:, :4]  # input_ids, attention_mask, decoder_input_ids


def _mixer(timm):
    from timm.models.mlp_mixer import MlpMixer

    return MlpMixer(num_classes=10, img_size=32, patch_size=8, num_blocks=2, embed_dim=32), _image()
_DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=99,
                max_position_embeddings=64, use_cache=False)
_ENCODER = dict(_TINY)
_SEQ2SEQ = dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=99, max_position_embeddings=64, dropout=0.0,
                attention_dropout=0.0, activation_dropout=0.0, use_cache=False, pad_token_id=0,
                decoder_start_token_id=1)

EXTRA_MODELS: list[ZooModel] = [
    ZooModel("squeezenet", "torchvision", _tv("squeezenet1_1")),
    ZooModel("shufflenet_v2", "torchvision", _tv("shufflenet_v2_x0_5")),
    ZooModel("mnasnet", "torchvision", _tv("mnasnet0_5", dropout=0.0)),
    ZooModel("densenet", "torchvision", _densenet),
    ZooModel("resnext", "torchvision", _resnext),
    ZooModel("swin_tv", "torchvision", _swin_tv),
    ZooModel("vit_tv", "torchvision", _vit_tv),
    ZooModel("resnet10t_timm", "timm", _timm("resnet10t")),
    ZooModel("mixer_timm", "timm", _mixer),
    ZooModel("efficientnet_timm", "timm", _timm("efficientnet_lite0", hw=64)),
    ZooModel("mobilevit_timm", "timm", _timm("mobilevitv2_050", hw=64)),
    ZooModel("poolformer_timm", "timm", _timm("poolformer_s12")),
    ZooModel("deit_timm", "timm", _timm("deit_tiny_patch16_224", img_size=32, patch_size=8)),
    ZooModel("ghostnet_timm", "timm", _timm("ghostnet_050")),
    ZooModel("distilbert", "transformers", _hf("DistilBertConfig", "DistilBertModel", dim=32, hidden_dim=64,
                                               n_layers=2, n_heads=2, vocab_size=99, max_position_embeddings=64,
                                               dropout=0.0, attention_dropout=0.0)),
    ZooModel("roberta", "transformers", _hf("RobertaConfig", "RobertaModel", **_ENCODER, pad_token_id=0)),
    ZooModel("albert", "transformers", _hf("AlbertConfig", "AlbertModel", embedding_size=16, **_ENCODER)),
    ZooModel("electra", "transformers", _hf("ElectraConfig", "ElectraModel", embedding_size=16, **_ENCODER)),
    ZooModel("deberta_v2", "transformers", _hf("DebertaV2Config", "DebertaV2Model", **_ENCODER)),
    ZooModel("gpt_neo", "transformers", _hf("GPTNeoConfig", "GPTNeoForCausalLM", hidden_size=32, num_layers=2,
                                            num_heads=2, attention_types=[[["global", "local"], 1]], window_size=4,
                                            vocab_size=99, max_position_embeddings=64, use_cache=False,
                                            embed_dropout=0.0, attention_dropout=0.0, resid_dropout=0.0)),
    ZooModel("opt", "transformers", _hf("OPTConfig", "OPTForCausalLM", hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                        num_attention_heads=2, vocab_size=99, max_position_embeddings=64,
                                        word_embed_proj_dim=32, dropout=0.0, use_cache=False)),
    ZooModel("mistral", "transformers", _hf("MistralConfig", "MistralForCausalLM", **_DECODER, num_key_value_heads=1,
                                            sliding_window=4)),
    ZooModel("qwen2", "transformers", _hf("Qwen2Config", "Qwen2ForCausalLM", **_DECODER, num_key_value_heads=1)),
    ZooModel("phi", "transformers", _hf("PhiConfig", "PhiForCausalLM", **_DECODER, resid_pdrop=0.0, embd_pdrop=0.0)),
    ZooModel("gemma", "transformers", _hf("GemmaConfig", "GemmaForCausalLM", **_DECODER, num_key_value_heads=1,
                                          head_dim=16)),
    ZooModel("gpt_neox", "transformers", _hf("GPTNeoXConfig", "GPTNeoXForCausalLM", **_DECODER)),
    ZooModel("bloom", "transformers", _hf("BloomConfig", "BloomForCausalLM", hidden_size=32, n_layer=2, n_head=2,
                                          vocab_size=99, use_cache=False)),
    ZooModel("mixtral", "transformers", _hf("MixtralConfig", "MixtralForCausalLM", **_DECODER, num_key_value_heads=1,
                                            num_local_experts=4, num_experts_per_tok=2)),
    ZooModel("mbart", "transformers", _hf("MBartConfig", "MBartModel", **_SEQ2SEQ)),
    ZooModel("marian", "transformers", _hf("MarianConfig", "MarianModel", _ids_and_decoder_ids, **_SEQ2SEQ)),
    ZooModel("clip_vision", "transformers", _hf("CLIPVisionConfig", "CLIPVisionModel", _image, hidden_size=32,
                                                intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                image_size=32, patch_size=8)),
    ZooModel("swin_hf", "transformers", _hf("SwinConfig", "SwinModel", _image, image_size=32, patch_size=4,
                                            embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4,
                                            drop_path_rate=0.0, hidden_dropout_prob=0.0,
                                            attention_probs_dropout_prob=0.0)),
    ZooModel("convnext_hf", "transformers", _hf("ConvNextConfig", "ConvNextModel", _image, hidden_sizes=[8, 16],
                                                depths=[1, 1], num_stages=2)),
    ZooModel("segformer", "transformers", _hf("SegformerConfig", "SegformerModel", _image, num_encoder_blocks=2,
                                              depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                                              patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
                                              mlp_ratios=[2, 2], hidden_dropout_prob=0.0,
                                              attention_probs_dropout_prob=0.0, drop_path_rate=0.0)),
    ZooModel("wav2vec2", "transformers", _hf("Wav2Vec2Config", "Wav2Vec2Model", lambda: (torch.randn(2, 400),),
                                             hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                                             conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                             num_conv_pos_embedding_groups=2, hidden_dropout=0.0,
                                             attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
                                             mask_time_prob=0.0, layerdrop=0.0)),
]

BY_NAME.update({m.name: m for m in EXTRA_MODELS})
