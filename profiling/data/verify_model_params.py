#!/usr/bin/env python3
"""Optional check of gen_model_params.py against the reference libraries.

Not needed to generate the data and not run by CI: it needs torch, diffusers
and transformers, e.g. in a scratch venv outside the repository:

    python3 -m venv /tmp/pvenv
    /tmp/pvenv/bin/pip install torch==2.13.0 diffusers transformers accelerate
    /tmp/pvenv/bin/python profiling/data/verify_model_params.py

Every model is instantiated on the meta device (no weights are allocated or
downloaded) from a hand-written copy of its published config.json, and its
named_parameters() are compared with the generator's rows: same names, same
shapes, same order, same total. The Wan2.1 models are named as the Wan2.1
reference code names them; diffusers' own converters
(convert_wan_transformer_to_diffusers, convert_wan_vae_to_diffusers) map them
onto the diffusers models, and the UMT5 encoder is mapped by hand onto
transformers' UMT5EncoderModel.
Verified with torch 2.13.0, diffusers 0.42.1, transformers 5.24.0.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "gen_model_params", os.path.join(HERE, "gen_model_params.py"))
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

# --- config.json contents of the public repositories (hand copies) ----------

SDXL_UNET = {  # stabilityai/stable-diffusion-xl-base-1.0 unet/config.json
    "act_fn": "silu", "addition_embed_type": "text_time",
    "addition_embed_type_num_heads": 64, "addition_time_embed_dim": 256,
    "attention_head_dim": [5, 10, 20], "block_out_channels": [320, 640, 1280],
    "center_input_sample": False, "class_embed_type": None,
    "class_embeddings_concat": False, "conv_in_kernel": 3,
    "conv_out_kernel": 3, "cross_attention_dim": 2048,
    "cross_attention_norm": None,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D",
                         "CrossAttnDownBlock2D"],
    "downsample_padding": 1, "dual_cross_attention": False,
    "encoder_hid_dim": None, "encoder_hid_dim_type": None,
    "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 4,
    "layers_per_block": 2, "mid_block_only_cross_attention": None,
    "mid_block_scale_factor": 1, "mid_block_type": "UNetMidBlock2DCrossAttn",
    "norm_eps": 1e-05, "norm_num_groups": 32, "num_attention_heads": None,
    "num_class_embeds": None, "only_cross_attention": False,
    "out_channels": 4, "projection_class_embeddings_input_dim": 2816,
    "resnet_out_scale_factor": 1.0, "resnet_skip_time_act": False,
    "resnet_time_scale_shift": "default", "sample_size": 128,
    "time_cond_proj_dim": None, "time_embedding_act_fn": None,
    "time_embedding_dim": None, "time_embedding_type": "positional",
    "timestep_post_act": None, "transformer_layers_per_block": [1, 2, 10],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                       "UpBlock2D"],
    "upcast_attention": False, "use_linear_projection": True,
}

SDXL_REFINER_UNET = dict(SDXL_UNET)
SDXL_REFINER_UNET.update({  # stabilityai/stable-diffusion-xl-refiner-1.0 unet/config.json
    "attention_head_dim": [6, 12, 24, 24],
    "block_out_channels": [384, 768, 1536, 1536],
    "cross_attention_dim": 1280,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D",
                         "CrossAttnDownBlock2D", "DownBlock2D"],
    "projection_class_embeddings_input_dim": 2560,
    "transformer_layers_per_block": 4,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D",
                       "CrossAttnUpBlock2D", "UpBlock2D"],
})

SDXL_VAE = {  # stabilityai/stable-diffusion-xl-base-1.0 vae/config.json
    "act_fn": "silu", "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4, "force_upcast": True,
    "in_channels": 3, "latent_channels": 4, "layers_per_block": 2,
    "norm_num_groups": 32, "out_channels": 3, "sample_size": 1024,
    "scaling_factor": 0.13025, "up_block_types": ["UpDecoderBlock2D"] * 4,
}

FLUX_VAE = dict(SDXL_VAE)
FLUX_VAE.update({  # black-forest-labs/FLUX.1-dev vae/config.json
    "latent_channels": 16, "scaling_factor": 0.3611, "shift_factor": 0.1159,
    "use_quant_conv": False, "use_post_quant_conv": False,
})

FLUX1_DEV = {  # black-forest-labs/FLUX.1-dev transformer/config.json
    "attention_head_dim": 128, "guidance_embeds": True, "in_channels": 64,
    "joint_attention_dim": 4096, "num_attention_heads": 24, "num_layers": 19,
    "num_single_layers": 38, "patch_size": 1, "pooled_projection_dim": 768,
    "axes_dims_rope": [16, 56, 56],
}

CLIP_L = {  # stabilityai/stable-diffusion-xl-base-1.0 text_encoder/config.json
    "vocab_size": 49408, "hidden_size": 768, "intermediate_size": 3072,
    "num_hidden_layers": 12, "num_attention_heads": 12,
    "max_position_embeddings": 77, "projection_dim": 768,
    "hidden_act": "quick_gelu",
}

CLIP_G = {  # stabilityai/stable-diffusion-xl-base-1.0 text_encoder_2/config.json
    "vocab_size": 49408, "hidden_size": 1280, "intermediate_size": 5120,
    "num_hidden_layers": 32, "num_attention_heads": 20,
    "max_position_embeddings": 77, "projection_dim": 1280, "hidden_act": "gelu",
}

T5XXL = {  # black-forest-labs/FLUX.1-dev text_encoder_2/config.json
    "vocab_size": 32128, "d_model": 4096, "d_kv": 64, "d_ff": 10240,
    "num_layers": 24, "num_heads": 64, "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128, "feed_forward_proj": "gated-gelu",
    "is_gated_act": True, "dense_act_fn": "gelu_new",
    "tie_word_embeddings": False,
}

UMT5XXL = {  # Wan-AI/Wan2.1-T2V-14B-Diffusers text_encoder/config.json
    "vocab_size": 256384, "d_model": 4096, "d_kv": 64, "d_ff": 10240,
    "num_layers": 24, "num_heads": 64, "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128, "feed_forward_proj": "gated-gelu",
    "tie_word_embeddings": False,
}

WAN_14B = {  # Wan-AI/Wan2.1-T2V-14B-Diffusers transformer/config.json
    "added_kv_proj_dim": None, "attention_head_dim": 128,
    "cross_attn_norm": True, "eps": 1e-06, "ffn_dim": 13824, "freq_dim": 256,
    "image_dim": None, "in_channels": 16, "num_attention_heads": 40,
    "num_layers": 40, "out_channels": 16, "patch_size": [1, 2, 2],
    "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024,
    "text_dim": 4096,
}

WAN_VAE = {  # Wan-AI/Wan2.1-T2V-14B-Diffusers vae/config.json
    "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2, "attn_scales": [],
    "temperal_downsample": [False, True, True], "dropout": 0.0,
}


def params_of(model) -> list[tuple[str, tuple[int, ...]]]:
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def compare(mid, got, want, ordered=True) -> bool:
    """got: generator rows; want: reference rows."""
    ok = True
    if ordered and got != want:
        ok = False
    gd, wd = dict(got), dict(want)
    missing = [n for n in wd if n not in gd]
    extra = [n for n in gd if n not in wd]
    shape = [(n, gd[n], wd[n]) for n in gd if n in wd and gd[n] != wd[n]]
    tg = sum(math.prod(s) for _, s in got)
    tw = sum(math.prod(s) for _, s in want)
    if missing or extra or shape or tg != tw or len(got) != len(want):
        ok = False
    status = "OK " if ok else "BAD"
    print(f"{status} {mid:18s} gen {tg:>15,d} / {len(got):5d} tensors   "
          f"ref {tw:>15,d} / {len(want):5d} tensors"
          + ("" if ordered else "  (unordered)"))
    for n in missing[:5]:
        print("     missing", n, wd[n])
    for n in extra[:5]:
        print("     extra  ", n, gd[n])
    for s in shape[:5]:
        print("     shape  ", *s)
    if ordered and not (missing or extra or shape) and got != want:
        i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        print("     order differs first at", i, got[i], want[i])
    return ok


def meta(fn):
    with torch.device("meta"):
        return fn()


def main() -> int:
    from diffusers import (AutoencoderKL, AutoencoderKLWan,
                           FluxTransformer2DModel, UNet2DConditionModel,
                           WanTransformer3DModel)
    from diffusers.loaders.single_file_utils import (
        convert_wan_transformer_to_diffusers, convert_wan_vae_to_diffusers)
    from transformers import (CLIPTextConfig, CLIPTextModel,
                              CLIPTextModelWithProjection, T5Config,
                              T5EncoderModel, UMT5Config, UMT5EncoderModel)

    ok = True
    ref = {
        "sdxl_unet": lambda: UNet2DConditionModel(**SDXL_UNET),
        "sdxl_refiner_unet": lambda: UNet2DConditionModel(**SDXL_REFINER_UNET),
        "sdxl_vae": lambda: AutoencoderKL(**SDXL_VAE),
        "clip_l": lambda: CLIPTextModel(CLIPTextConfig(**CLIP_L)),
        "clip_g": lambda: CLIPTextModelWithProjection(CLIPTextConfig(**CLIP_G)),
        "flux1_dev": lambda: FluxTransformer2DModel(**FLUX1_DEV),
        "flux_vae": lambda: AutoencoderKL(**FLUX_VAE),
        "t5xxl_encoder": lambda: T5EncoderModel(T5Config(**T5XXL)),
    }
    for mid, fn in ref.items():
        want = params_of(meta(fn))
        if mid == "clip_l" and not want[0][0].startswith("text_model."):
            # transformers >= 5 keeps CLIPTextModel's modules at top level and
            # strips the checkpoint's "text_model." prefix when loading
            # (conversion_mapping.py: PrefixChange(prefix_to_remove=
            # "text_model")); the data keeps the checkpoint's names, which
            # transformers 4.x also used in memory.
            want = [("text_model." + n, s) for n, s in want]
            print("    clip_l: reference names prefixed with 'text_model.' "
                  "(transformers >= 5 drops it in memory)")
        ok &= compare(mid, gen.build(mid), want)

    # WAN 2.1 14B: Wan2.1 names -> diffusers names via diffusers' converter
    rows = gen.build("wan21_14b")
    sd = {n: torch.empty(s, device="meta") for n, s in rows}
    conv = convert_wan_transformer_to_diffusers(sd)
    got = [(n, tuple(t.shape)) for n, t in conv.items()]
    want = params_of(meta(lambda: WanTransformer3DModel(**WAN_14B)))
    ok &= compare("wan21_14b", got, want, ordered=False)

    rows = gen.build("wan21_vae")
    sd = {n: torch.empty(s, device="meta") for n, s in rows}
    conv = convert_wan_vae_to_diffusers(sd)
    got = [(n, tuple(t.shape)) for n, t in conv.items()]
    want = params_of(meta(lambda: AutoencoderKLWan(**WAN_VAE)))
    ok &= compare("wan21_vae", got, want, ordered=False)

    # UMT5-XXL: Wan2.1 T5Encoder names -> transformers UMT5EncoderModel names
    def umt5_name(n: str) -> str:
        if n == "token_embedding.weight":
            return "shared.weight"
        if n == "norm.weight":
            return "encoder.final_layer_norm.weight"
        m = re.fullmatch(r"blocks\.(\d+)\.(.+)", n)
        i, rest = m.group(1), m.group(2)
        b = f"encoder.block.{i}.layer"
        table = {
            "norm1.weight": f"{b}.0.layer_norm.weight",
            "attn.q.weight": f"{b}.0.SelfAttention.q.weight",
            "attn.k.weight": f"{b}.0.SelfAttention.k.weight",
            "attn.v.weight": f"{b}.0.SelfAttention.v.weight",
            "attn.o.weight": f"{b}.0.SelfAttention.o.weight",
            "pos_embedding.embedding.weight":
                f"{b}.0.SelfAttention.relative_attention_bias.weight",
            "norm2.weight": f"{b}.1.layer_norm.weight",
            "ffn.gate.0.weight": f"{b}.1.DenseReluDense.wi_0.weight",
            "ffn.fc1.weight": f"{b}.1.DenseReluDense.wi_1.weight",
            "ffn.fc2.weight": f"{b}.1.DenseReluDense.wo.weight",
        }
        return table[rest]

    got = [(umt5_name(n), s) for n, s in gen.build("umt5xxl_encoder")]
    want = params_of(meta(lambda: UMT5EncoderModel(UMT5Config(**UMT5XXL))))
    ok &= compare("umt5xxl_encoder", got, want, ordered=False)

    print("all match" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
