#!/usr/bin/env python3
"""Enumerate every parameter tensor of real public diffusion-workflow models.

Pure Python 3.11 standard library: no torch, diffusers or transformers import.
Each model is encoded from its published hyperparameters (the values in the
official config.json of the public model repository, or the config function of
the reference code) and the reference implementation's module structure, and
yields its parameter tensors in the reference implementation's
``named_parameters()`` order, with the exact names and shapes it gives them.
Tied parameters (T5's shared embedding) are listed once, as
``named_parameters()`` does.

Run ``python3 profiling/data/gen_model_params.py`` to rewrite
``model_params.csv`` beside this file and the totals table in README.md
(deterministic output). ``python3 profiling/data/gen_model_params.py --check``
only verifies that both are up to date (exit 1 if not).

Every total is asserted against the count it was verified with (see
``EXPECTED``): the published parameter count where one is published, and a
meta-device instantiation of the reference implementation (torch 2.13.0,
diffusers 0.42.1, transformers 5.24.0) for every model; see README.md.
"""

from __future__ import annotations

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CSV_PATH = os.path.join(HERE, "model_params.csv")


class Params:
    """Collects (name, shape) rows in registration order."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, tuple[int, ...]]] = []
        self._seen: set[str] = set()

    def p(self, name: str, *shape: int) -> None:
        if name in self._seen:
            raise ValueError(f"duplicate tensor name {name}")
        if not shape or any((not isinstance(d, int)) or d <= 0 for d in shape):
            raise ValueError(f"bad shape {shape} for {name}")
        self._seen.add(name)
        self.rows.append((name, tuple(shape)))

    # torch.nn.Linear(in, out): weight [out, in], bias [out]
    def linear(self, pfx: str, fin: int, fout: int, bias: bool = True) -> None:
        self.p(f"{pfx}.weight", fout, fin)
        if bias:
            self.p(f"{pfx}.bias", fout)

    # torch.nn.ConvNd(in, out, kernel): weight [out, in, *kernel], bias [out]
    def conv(self, pfx: str, cin: int, cout: int, kernel: tuple[int, ...],
             bias: bool = True) -> None:
        self.p(f"{pfx}.weight", cout, cin, *kernel)
        if bias:
            self.p(f"{pfx}.bias", cout)

    # LayerNorm / GroupNorm with affine parameters: weight [C], bias [C]
    def affine(self, pfx: str, dim: int, bias: bool = True) -> None:
        self.p(f"{pfx}.weight", dim)
        if bias:
            self.p(f"{pfx}.bias", dim)

    # torch.nn.Embedding(num, dim): weight [num, dim]
    def embedding(self, pfx: str, num: int, dim: int) -> None:
        self.p(f"{pfx}.weight", num, dim)


def _j(*parts: str) -> str:
    return ".".join(p for p in parts if p)


# ---------------------------------------------------------------------------
# diffusers building blocks (diffusers/models/...)
# ---------------------------------------------------------------------------

def d_resnet2d(P: Params, pfx: str, cin: int, cout: int,
               temb: int | None) -> None:
    """diffusers ResnetBlock2D (models/resnet.py)."""
    P.affine(_j(pfx, "norm1"), cin)                 # GroupNorm
    P.conv(_j(pfx, "conv1"), cin, cout, (3, 3))
    if temb is not None:
        P.linear(_j(pfx, "time_emb_proj"), temb, cout)
    P.affine(_j(pfx, "norm2"), cout)                # GroupNorm
    P.conv(_j(pfx, "conv2"), cout, cout, (3, 3))
    if cin != cout:
        P.conv(_j(pfx, "conv_shortcut"), cin, cout, (1, 1))


def d_basic_transformer_block(P: Params, pfx: str, dim: int,
                              cross_dim: int) -> None:
    """diffusers BasicTransformerBlock (models/attention.py), as built by
    Transformer2DModel for the UNet: layer_norm, GEGLU feed-forward (mult 4),
    attention without q/k/v bias, output projection with bias."""
    P.affine(_j(pfx, "norm1"), dim)
    P.linear(_j(pfx, "attn1.to_q"), dim, dim, bias=False)
    P.linear(_j(pfx, "attn1.to_k"), dim, dim, bias=False)
    P.linear(_j(pfx, "attn1.to_v"), dim, dim, bias=False)
    P.linear(_j(pfx, "attn1.to_out.0"), dim, dim)
    P.affine(_j(pfx, "norm2"), dim)
    P.linear(_j(pfx, "attn2.to_q"), dim, dim, bias=False)
    P.linear(_j(pfx, "attn2.to_k"), cross_dim, dim, bias=False)
    P.linear(_j(pfx, "attn2.to_v"), cross_dim, dim, bias=False)
    P.linear(_j(pfx, "attn2.to_out.0"), dim, dim)
    P.affine(_j(pfx, "norm3"), dim)
    P.linear(_j(pfx, "ff.net.0.proj"), dim, dim * 4 * 2)   # GEGLU
    P.linear(_j(pfx, "ff.net.2"), dim * 4, dim)


def d_transformer2d(P: Params, pfx: str, channels: int, layers: int,
                    cross_dim: int) -> None:
    """diffusers Transformer2DModel, continuous input, use_linear_projection."""
    P.affine(_j(pfx, "norm"), channels)             # GroupNorm(32)
    P.linear(_j(pfx, "proj_in"), channels, channels)
    for k in range(layers):
        d_basic_transformer_block(P, _j(pfx, f"transformer_blocks.{k}"),
                                  channels, cross_dim)
    P.linear(_j(pfx, "proj_out"), channels, channels)


def unet2d_condition(P: Params, cfg: dict) -> None:
    """diffusers UNet2DConditionModel (models/unets/unet_2d_condition.py) with
    addition_embed_type "text_time", linear projection, no class embedding."""
    boc = cfg["block_out_channels"]
    n = len(boc)
    # attention_head_dim (used as head counts by the SDXL configs) changes no
    # parameter shape: every projection is channels x channels.
    tlpb = cfg["transformer_layers_per_block"]
    tlpb = tlpb if isinstance(tlpb, list) else [tlpb] * n
    lpb = cfg["layers_per_block"]
    cross = cfg["cross_attention_dim"]
    temb = boc[0] * 4
    P.conv("conv_in", cfg["in_channels"], boc[0], (3, 3))
    P.linear("time_embedding.linear_1", boc[0], temb)
    P.linear("time_embedding.linear_2", temb, temb)
    P.linear("add_embedding.linear_1",
             cfg["projection_class_embeddings_input_dim"], temb)
    P.linear("add_embedding.linear_2", temb, temb)
    # down blocks: for cross-attention blocks diffusers registers
    # `attentions` before `resnets`, then `downsamplers`.
    out_ch = boc[0]
    for i, btype in enumerate(cfg["down_block_types"]):
        in_ch, out_ch = out_ch, boc[i]
        pfx = f"down_blocks.{i}"
        if btype == "CrossAttnDownBlock2D":
            for j in range(lpb):
                d_transformer2d(P, f"{pfx}.attentions.{j}", out_ch, tlpb[i],
                                cross)
        else:
            assert btype == "DownBlock2D", btype
        for j in range(lpb):
            d_resnet2d(P, f"{pfx}.resnets.{j}", in_ch if j == 0 else out_ch,
                       out_ch, temb)
        if i != n - 1:
            P.conv(f"{pfx}.downsamplers.0.conv", out_ch, out_ch, (3, 3))
    # up blocks (registered before mid_block in UNet2DConditionModel)
    rboc = boc[::-1]
    rtl = tlpb[::-1]
    prev = rboc[0]
    for i, btype in enumerate(cfg["up_block_types"]):
        out_ch = rboc[i]
        in_ch = rboc[min(i + 1, n - 1)]
        pfx = f"up_blocks.{i}"
        if btype == "CrossAttnUpBlock2D":
            for j in range(lpb + 1):
                d_transformer2d(P, f"{pfx}.attentions.{j}", out_ch, rtl[i],
                                cross)
        else:
            assert btype == "UpBlock2D", btype
        for j in range(lpb + 1):
            skip = in_ch if j == lpb else out_ch
            rin = prev if j == 0 else out_ch
            d_resnet2d(P, f"{pfx}.resnets.{j}", rin + skip, out_ch, temb)
        if i != n - 1:
            P.conv(f"{pfx}.upsamplers.0.conv", out_ch, out_ch, (3, 3))
        prev = out_ch
    # mid block: UNetMidBlock2DCrossAttn
    assert cfg["mid_block_type"] == "UNetMidBlock2DCrossAttn"
    mid = boc[-1]
    d_transformer2d(P, "mid_block.attentions.0", mid, tlpb[-1], cross)
    d_resnet2d(P, "mid_block.resnets.0", mid, mid, temb)
    d_resnet2d(P, "mid_block.resnets.1", mid, mid, temb)
    P.affine("conv_norm_out", boc[0])
    P.conv("conv_out", boc[0], cfg["out_channels"], (3, 3))


def d_vae_attention(P: Params, pfx: str, ch: int) -> None:
    """diffusers Attention as built by UNetMidBlock2D for the VAE
    (one head, group_norm, biased projections)."""
    P.affine(_j(pfx, "group_norm"), ch)
    P.linear(_j(pfx, "to_q"), ch, ch)
    P.linear(_j(pfx, "to_k"), ch, ch)
    P.linear(_j(pfx, "to_v"), ch, ch)
    P.linear(_j(pfx, "to_out.0"), ch, ch)


def autoencoder_kl(P: Params, cfg: dict) -> None:
    """diffusers AutoencoderKL (models/autoencoders/autoencoder_kl.py, vae.py)."""
    boc = cfg["block_out_channels"]
    n = len(boc)
    lpb = cfg["layers_per_block"]
    lat = cfg["latent_channels"]
    # Encoder
    P.conv("encoder.conv_in", cfg["in_channels"], boc[0], (3, 3))
    out_ch = boc[0]
    for i in range(n):
        in_ch, out_ch = out_ch, boc[i]
        for j in range(lpb):
            d_resnet2d(P, f"encoder.down_blocks.{i}.resnets.{j}",
                       in_ch if j == 0 else out_ch, out_ch, None)
        if i != n - 1:
            P.conv(f"encoder.down_blocks.{i}.downsamplers.0.conv",
                   out_ch, out_ch, (3, 3))
    d_vae_attention(P, "encoder.mid_block.attentions.0", boc[-1])
    d_resnet2d(P, "encoder.mid_block.resnets.0", boc[-1], boc[-1], None)
    d_resnet2d(P, "encoder.mid_block.resnets.1", boc[-1], boc[-1], None)
    P.affine("encoder.conv_norm_out", boc[-1])
    P.conv("encoder.conv_out", boc[-1], 2 * lat, (3, 3))   # double_z
    # Decoder (conv_in, up_blocks list, mid_block, ... in registration order;
    # the mid block is assigned before the up blocks are appended, but the
    # empty ModuleList `up_blocks` is registered first)
    rboc = boc[::-1]
    P.conv("decoder.conv_in", lat, rboc[0], (3, 3))
    prev = rboc[0]
    for i in range(n):
        out_ch = rboc[i]
        for j in range(lpb + 1):
            d_resnet2d(P, f"decoder.up_blocks.{i}.resnets.{j}",
                       prev if j == 0 else out_ch, out_ch, None)
        if i != n - 1:
            P.conv(f"decoder.up_blocks.{i}.upsamplers.0.conv",
                   out_ch, out_ch, (3, 3))
        prev = out_ch
    d_vae_attention(P, "decoder.mid_block.attentions.0", rboc[0])
    d_resnet2d(P, "decoder.mid_block.resnets.0", rboc[0], rboc[0], None)
    d_resnet2d(P, "decoder.mid_block.resnets.1", rboc[0], rboc[0], None)
    P.affine("decoder.conv_norm_out", rboc[-1])
    P.conv("decoder.conv_out", rboc[-1], cfg["out_channels"], (3, 3))
    if cfg.get("use_quant_conv", True):
        P.conv("quant_conv", 2 * lat, 2 * lat, (1, 1))
    if cfg.get("use_post_quant_conv", True):
        P.conv("post_quant_conv", lat, lat, (1, 1))


def flux_transformer(P: Params, cfg: dict) -> None:
    """diffusers FluxTransformer2DModel (models/transformers/transformer_flux.py)."""
    dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    hd = cfg["attention_head_dim"]
    mlp = dim * 4
    out_ch = cfg.get("out_channels") or cfg["in_channels"]
    # CombinedTimestepGuidanceTextProjEmbeddings (guidance_embeds=True);
    # Timesteps projection has 256 channels and no parameters.
    P.linear("time_text_embed.timestep_embedder.linear_1", 256, dim)
    P.linear("time_text_embed.timestep_embedder.linear_2", dim, dim)
    if cfg["guidance_embeds"]:
        P.linear("time_text_embed.guidance_embedder.linear_1", 256, dim)
        P.linear("time_text_embed.guidance_embedder.linear_2", dim, dim)
    P.linear("time_text_embed.text_embedder.linear_1",
             cfg["pooled_projection_dim"], dim)
    P.linear("time_text_embed.text_embedder.linear_2", dim, dim)
    P.linear("context_embedder", cfg["joint_attention_dim"], dim)
    P.linear("x_embedder", cfg["in_channels"], dim)
    for b in range(cfg["num_layers"]):
        pfx = f"transformer_blocks.{b}"
        P.linear(f"{pfx}.norm1.linear", dim, 6 * dim)          # AdaLayerNormZero
        P.linear(f"{pfx}.norm1_context.linear", dim, 6 * dim)
        a = f"{pfx}.attn"
        P.p(f"{a}.norm_q.weight", hd)                          # RMSNorm
        P.p(f"{a}.norm_k.weight", hd)
        P.linear(f"{a}.to_q", dim, dim)
        P.linear(f"{a}.to_k", dim, dim)
        P.linear(f"{a}.to_v", dim, dim)
        P.linear(f"{a}.to_out.0", dim, dim)
        P.p(f"{a}.norm_added_q.weight", hd)
        P.p(f"{a}.norm_added_k.weight", hd)
        P.linear(f"{a}.add_q_proj", dim, dim)
        P.linear(f"{a}.add_k_proj", dim, dim)
        P.linear(f"{a}.add_v_proj", dim, dim)
        P.linear(f"{a}.to_add_out", dim, dim)
        P.linear(f"{pfx}.ff.net.0.proj", dim, mlp)             # GELU(tanh)
        P.linear(f"{pfx}.ff.net.2", mlp, dim)
        P.linear(f"{pfx}.ff_context.net.0.proj", dim, mlp)
        P.linear(f"{pfx}.ff_context.net.2", mlp, dim)
    for b in range(cfg["num_single_layers"]):
        pfx = f"single_transformer_blocks.{b}"
        P.linear(f"{pfx}.norm.linear", dim, 3 * dim)           # AdaLayerNormZeroSingle
        P.linear(f"{pfx}.proj_mlp", dim, mlp)
        P.linear(f"{pfx}.proj_out", dim + mlp, dim)
        a = f"{pfx}.attn"
        P.p(f"{a}.norm_q.weight", hd)
        P.p(f"{a}.norm_k.weight", hd)
        P.linear(f"{a}.to_q", dim, dim)
        P.linear(f"{a}.to_k", dim, dim)
        P.linear(f"{a}.to_v", dim, dim)                        # pre_only: no to_out
    P.linear("norm_out.linear", dim, 2 * dim)                  # AdaLayerNormContinuous
    P.linear("proj_out", dim, cfg["patch_size"] ** 2 * out_ch)


# ---------------------------------------------------------------------------
# transformers building blocks
# ---------------------------------------------------------------------------

def clip_text(P: Params, cfg: dict) -> None:
    """transformers CLIPTextModel / CLIPTextModelWithProjection
    (models/clip/modeling_clip.py)."""
    h = cfg["hidden_size"]
    ff = cfg["intermediate_size"]
    t = "text_model"
    P.embedding(f"{t}.embeddings.token_embedding", cfg["vocab_size"], h)
    P.embedding(f"{t}.embeddings.position_embedding",
                cfg["max_position_embeddings"], h)
    for i in range(cfg["num_hidden_layers"]):
        pfx = f"{t}.encoder.layers.{i}"
        # CLIPAttention registers k_proj, v_proj, q_proj, out_proj
        P.linear(f"{pfx}.self_attn.k_proj", h, h)
        P.linear(f"{pfx}.self_attn.v_proj", h, h)
        P.linear(f"{pfx}.self_attn.q_proj", h, h)
        P.linear(f"{pfx}.self_attn.out_proj", h, h)
        P.affine(f"{pfx}.layer_norm1", h)
        P.linear(f"{pfx}.mlp.fc1", h, ff)
        P.linear(f"{pfx}.mlp.fc2", ff, h)
        P.affine(f"{pfx}.layer_norm2", h)
    P.affine(f"{t}.final_layer_norm", h)
    if cfg["with_projection"]:
        P.linear("text_projection", h, cfg["projection_dim"], bias=False)


def t5_encoder(P: Params, cfg: dict) -> None:
    """transformers T5EncoderModel (models/t5/modeling_t5.py), gated-gelu FF.
    `shared.weight` is tied to `encoder.embed_tokens.weight` (listed once)."""
    d = cfg["d_model"]
    inner = cfg["num_heads"] * cfg["d_kv"]
    ff = cfg["d_ff"]
    assert cfg["feed_forward_proj"] == "gated-gelu"
    P.embedding("shared", cfg["vocab_size"], d)
    for i in range(cfg["num_layers"]):
        pfx = f"encoder.block.{i}"
        sa = f"{pfx}.layer.0.SelfAttention"
        P.linear(f"{sa}.q", d, inner, bias=False)
        P.linear(f"{sa}.k", d, inner, bias=False)
        P.linear(f"{sa}.v", d, inner, bias=False)
        P.linear(f"{sa}.o", inner, d, bias=False)
        if i == 0:   # only the first layer has relative_attention_bias
            P.embedding(f"{sa}.relative_attention_bias",
                        cfg["relative_attention_num_buckets"], cfg["num_heads"])
        P.p(f"{pfx}.layer.0.layer_norm.weight", d)
        P.linear(f"{pfx}.layer.1.DenseReluDense.wi_0", d, ff, bias=False)
        P.linear(f"{pfx}.layer.1.DenseReluDense.wi_1", d, ff, bias=False)
        P.linear(f"{pfx}.layer.1.DenseReluDense.wo", ff, d, bias=False)
        P.p(f"{pfx}.layer.1.layer_norm.weight", d)
    P.p("encoder.final_layer_norm.weight", d)


# ---------------------------------------------------------------------------
# Wan2.1 reference code (Wan-Video/Wan2.1, wan/modules/*.py)
# ---------------------------------------------------------------------------

def wan_t5_encoder(P: Params, cfg: dict) -> None:
    """Wan2.1 wan/modules/t5.py T5Encoder (umt5_xxl(encoder_only=True)),
    the module whose state dict is models_t5_umt5-xxl-enc-bf16.pth.
    shared_pos=False: every block has its own relative position embedding."""
    dim, da, df = cfg["dim"], cfg["dim_attn"], cfg["dim_ffn"]
    assert cfg["shared_pos"] is False
    P.embedding("token_embedding", cfg["vocab_size"], dim)
    for i in range(cfg["encoder_layers"]):
        pfx = f"blocks.{i}"
        P.p(f"{pfx}.norm1.weight", dim)                      # T5LayerNorm
        P.linear(f"{pfx}.attn.q", dim, da, bias=False)
        P.linear(f"{pfx}.attn.k", dim, da, bias=False)
        P.linear(f"{pfx}.attn.v", dim, da, bias=False)
        P.linear(f"{pfx}.attn.o", da, dim, bias=False)
        P.p(f"{pfx}.norm2.weight", dim)
        P.linear(f"{pfx}.ffn.gate.0", dim, df, bias=False)
        P.linear(f"{pfx}.ffn.fc1", dim, df, bias=False)
        P.linear(f"{pfx}.ffn.fc2", df, dim, bias=False)
        P.embedding(f"{pfx}.pos_embedding.embedding", cfg["num_buckets"],
                    cfg["num_heads"])
    P.p("norm.weight", dim)


def wan_model(P: Params, cfg: dict) -> None:
    """Wan2.1 wan/modules/model.py WanModel, model_type t2v.
    A module's own nn.Parameter (`modulation`) precedes its children in
    named_parameters(), so it comes first in each block and in the head."""
    dim, ffn = cfg["dim"], cfg["ffn_dim"]
    ps = tuple(cfg["patch_size"])
    assert cfg["model_type"] == "t2v" and cfg["qk_norm"] and cfg["cross_attn_norm"]
    P.conv("patch_embedding", cfg["in_dim"], dim, ps)          # Conv3d
    P.linear("text_embedding.0", cfg["text_dim"], dim)
    P.linear("text_embedding.2", dim, dim)
    P.linear("time_embedding.0", cfg["freq_dim"], dim)
    P.linear("time_embedding.2", dim, dim)
    P.linear("time_projection.1", dim, dim * 6)
    for b in range(cfg["num_layers"]):
        pfx = f"blocks.{b}"
        P.p(f"{pfx}.modulation", 1, 6, dim)
        # norm1 / norm2: WanLayerNorm without affine parameters
        for att in ("self_attn", "cross_attn"):
            if att == "cross_attn":
                P.affine(f"{pfx}.norm3", dim)      # cross_attn_norm=True
            for proj in ("q", "k", "v", "o"):
                P.linear(f"{pfx}.{att}.{proj}", dim, dim)
            P.p(f"{pfx}.{att}.norm_q.weight", dim)   # WanRMSNorm over dim
            P.p(f"{pfx}.{att}.norm_k.weight", dim)
        P.linear(f"{pfx}.ffn.0", dim, ffn)
        P.linear(f"{pfx}.ffn.2", ffn, dim)
    P.p("head.modulation", 1, 2, dim)
    P.linear("head.head", dim, math.prod(ps) * cfg["out_dim"])


def _wan_rms(P: Params, pfx: str, dim: int, images: bool) -> None:
    # RMS_norm(dim, channel_first=True, images, bias=False): gamma only,
    # shape (dim, 1, 1) for images, (dim, 1, 1, 1) for video.
    P.p(f"{pfx}.gamma", dim, 1, 1) if images else P.p(f"{pfx}.gamma", dim, 1, 1, 1)


def _wan_resblock(P: Params, pfx: str, cin: int, cout: int) -> None:
    _wan_rms(P, f"{pfx}.residual.0", cin, images=False)
    P.conv(f"{pfx}.residual.2", cin, cout, (3, 3, 3))      # CausalConv3d
    _wan_rms(P, f"{pfx}.residual.3", cout, images=False)
    P.conv(f"{pfx}.residual.6", cout, cout, (3, 3, 3))
    if cin != cout:
        P.conv(f"{pfx}.shortcut", cin, cout, (1, 1, 1))


def _wan_attnblock(P: Params, pfx: str, dim: int) -> None:
    _wan_rms(P, f"{pfx}.norm", dim, images=True)
    P.conv(f"{pfx}.to_qkv", dim, dim * 3, (1, 1))         # Conv2d
    P.conv(f"{pfx}.proj", dim, dim, (1, 1))


def _wan_resample(P: Params, pfx: str, dim: int, mode: str) -> None:
    if mode in ("upsample2d", "upsample3d"):
        P.conv(f"{pfx}.resample.1", dim, dim // 2, (3, 3))
        if mode == "upsample3d":
            P.conv(f"{pfx}.time_conv", dim, dim * 2, (3, 1, 1))
    else:
        P.conv(f"{pfx}.resample.1", dim, dim, (3, 3))
        if mode == "downsample3d":
            P.conv(f"{pfx}.time_conv", dim, dim, (3, 1, 1))


def wan_vae(P: Params, cfg: dict) -> None:
    """Wan2.1 wan/modules/vae.py WanVAE_ (as built by _video_vae), the module
    whose state dict is Wan2.1_VAE.pth."""
    dim, z = cfg["dim"], cfg["z_dim"]
    mult, nres = cfg["dim_mult"], cfg["num_res_blocks"]
    assert cfg["attn_scales"] == []
    tdown = cfg["temperal_downsample"]
    tup = tdown[::-1]
    # Encoder3d(dim, z*2, ...)
    dims = [dim * u for u in [1] + mult]
    P.conv("encoder.conv1", 3, dims[0], (3, 3, 3))
    k = 0
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
        for _ in range(nres):
            _wan_resblock(P, f"encoder.downsamples.{k}", cin, cout)
            k += 1
            cin = cout
        if i != len(mult) - 1:
            _wan_resample(P, f"encoder.downsamples.{k}", cout,
                          "downsample3d" if tdown[i] else "downsample2d")
            k += 1
    top = dims[-1]
    _wan_resblock(P, "encoder.middle.0", top, top)
    _wan_attnblock(P, "encoder.middle.1", top)
    _wan_resblock(P, "encoder.middle.2", top, top)
    _wan_rms(P, "encoder.head.0", top, images=False)
    P.conv("encoder.head.2", top, z * 2, (3, 3, 3))
    P.conv("conv1", z * 2, z * 2, (1, 1, 1))
    P.conv("conv2", z, z, (1, 1, 1))
    # Decoder3d(dim, z, ...)
    dims = [dim * u for u in [mult[-1]] + mult[::-1]]
    P.conv("decoder.conv1", z, dims[0], (3, 3, 3))
    _wan_resblock(P, "decoder.middle.0", dims[0], dims[0])
    _wan_attnblock(P, "decoder.middle.1", dims[0])
    _wan_resblock(P, "decoder.middle.2", dims[0], dims[0])
    k = 0
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
        if i in (1, 2, 3):
            cin = cin // 2       # the previous upsample halved the channels
        for _ in range(nres + 1):
            _wan_resblock(P, f"decoder.upsamples.{k}", cin, cout)
            k += 1
            cin = cout
        if i != len(mult) - 1:
            _wan_resample(P, f"decoder.upsamples.{k}", cout,
                          "upsample3d" if tup[i] else "upsample2d")
            k += 1
    _wan_rms(P, "decoder.head.0", dims[-1], images=False)
    P.conv("decoder.head.2", dims[-1], 3, (3, 3, 3))


# ---------------------------------------------------------------------------
# Model table: published hyperparameters, with their sources
# ---------------------------------------------------------------------------

SDXL_UNET = dict(  # stabilityai/stable-diffusion-xl-base-1.0 unet/config.json
    in_channels=4, out_channels=4, block_out_channels=[320, 640, 1280],
    layers_per_block=2, attention_head_dim=[5, 10, 20],
    transformer_layers_per_block=[1, 2, 10], cross_attention_dim=2048,
    down_block_types=["DownBlock2D", "CrossAttnDownBlock2D",
                      "CrossAttnDownBlock2D"],
    up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    mid_block_type="UNetMidBlock2DCrossAttn", addition_embed_type="text_time",
    addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816,
    use_linear_projection=True, norm_num_groups=32)

SDXL_REFINER_UNET = dict(  # stabilityai/stable-diffusion-xl-refiner-1.0 unet/config.json
    in_channels=4, out_channels=4, block_out_channels=[384, 768, 1536, 1536],
    layers_per_block=2, attention_head_dim=[6, 12, 24, 24],
    transformer_layers_per_block=4, cross_attention_dim=1280,
    down_block_types=["DownBlock2D", "CrossAttnDownBlock2D",
                      "CrossAttnDownBlock2D", "DownBlock2D"],
    up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                    "UpBlock2D"],
    mid_block_type="UNetMidBlock2DCrossAttn", addition_embed_type="text_time",
    addition_time_embed_dim=256, projection_class_embeddings_input_dim=2560,
    use_linear_projection=True, norm_num_groups=32)

SDXL_VAE = dict(  # stabilityai/stable-diffusion-xl-base-1.0 vae/config.json
    in_channels=3, out_channels=3, latent_channels=4,
    block_out_channels=[128, 256, 512, 512], layers_per_block=2,
    norm_num_groups=32, use_quant_conv=True, use_post_quant_conv=True)

FLUX_VAE = dict(  # black-forest-labs/FLUX.1-dev vae/config.json
    in_channels=3, out_channels=3, latent_channels=16,
    block_out_channels=[128, 256, 512, 512], layers_per_block=2,
    norm_num_groups=32, use_quant_conv=False, use_post_quant_conv=False)

CLIP_L = dict(  # stabilityai/stable-diffusion-xl-base-1.0 text_encoder/config.json
    vocab_size=49408, hidden_size=768, intermediate_size=3072,
    num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
    projection_dim=768, hidden_act="quick_gelu",
    with_projection=False)  # CLIPTextModel

CLIP_G = dict(  # stabilityai/stable-diffusion-xl-base-1.0 text_encoder_2/config.json
    vocab_size=49408, hidden_size=1280, intermediate_size=5120,
    num_hidden_layers=32, num_attention_heads=20, max_position_embeddings=77,
    projection_dim=1280, hidden_act="gelu",
    with_projection=True)  # CLIPTextModelWithProjection

FLUX1_DEV = dict(  # black-forest-labs/FLUX.1-dev transformer/config.json
    patch_size=1, in_channels=64, out_channels=None, num_layers=19,
    num_single_layers=38, attention_head_dim=128, num_attention_heads=24,
    joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
    axes_dims_rope=[16, 56, 56])

T5XXL = dict(  # black-forest-labs/FLUX.1-dev text_encoder_2/config.json (= google/t5-v1_1-xxl)
    vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
    num_heads=64, relative_attention_num_buckets=32,
    feed_forward_proj="gated-gelu")

UMT5XXL = dict(  # Wan-Video/Wan2.1 wan/modules/t5.py umt5_xxl()
    vocab_size=256384, dim=4096, dim_attn=4096, dim_ffn=10240, num_heads=64,
    encoder_layers=24, num_buckets=32, shared_pos=False)

WAN21_14B = dict(  # Wan-Video/Wan2.1 wan/configs/wan_t2v_14B.py + WanModel defaults
    model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=5120,
    ffn_dim=13824, freq_dim=256, text_dim=4096, out_dim=16, num_heads=40,
    num_layers=40, qk_norm=True, cross_attn_norm=True)

WAN21_VAE = dict(  # Wan-Video/Wan2.1 wan/modules/vae.py _video_vae(z_dim=16)
    dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
    temperal_downsample=[False, True, True])


# (model id, builder, config, source lines, verification line)
MODELS = [
    ("sdxl_unet", unet2d_condition, SDXL_UNET,
     ["stabilityai/stable-diffusion-xl-base-1.0 unet/config.json; "
      "diffusers UNet2DConditionModel (models/unets/unet_2d_condition.py)"],
     "meta-device diffusers UNet2DConditionModel: names, shapes and order "
     "identical; total equals the published 2,567,463,684"),
    ("sdxl_refiner_unet", unet2d_condition, SDXL_REFINER_UNET,
     ["stabilityai/stable-diffusion-xl-refiner-1.0 unet/config.json; "
      "diffusers UNet2DConditionModel"],
     "meta-device diffusers UNet2DConditionModel: names, shapes and order "
     "identical; layout agrees with the original-format refiner config "
     "(transformer depth 4 at levels 1-2 and in the middle block, none at "
     "levels 0 and 3, adm_in_channels 2560, context_dim 1280)"),
    ("sdxl_vae", autoencoder_kl, SDXL_VAE,
     ["stabilityai/stable-diffusion-xl-base-1.0 vae/config.json "
      "(same as stabilityai/sdxl-vae); diffusers AutoencoderKL"],
     "meta-device diffusers AutoencoderKL: names, shapes and order identical"),
    ("clip_l", clip_text, CLIP_L,
     ["stabilityai/stable-diffusion-xl-base-1.0 text_encoder/config.json "
      "(openai/clip-vit-large-patch14 text tower); transformers CLIPTextModel"],
     "meta-device transformers CLIPTextModel: names (with the checkpoint's "
     "'text_model.' prefix, which transformers >= 5 strips in memory), "
     "shapes and order identical"),
    ("clip_g", clip_text, CLIP_G,
     ["stabilityai/stable-diffusion-xl-base-1.0 text_encoder_2/config.json "
      "(laion/CLIP-ViT-bigG-14-laion2B-39B-b160k text tower); "
      "transformers CLIPTextModelWithProjection"],
     "meta-device transformers CLIPTextModelWithProjection: names, shapes "
     "and order identical"),
    ("flux1_dev", flux_transformer, FLUX1_DEV,
     ["black-forest-labs/FLUX.1-dev transformer/config.json; "
      "diffusers FluxTransformer2DModel (models/transformers/transformer_flux.py)"],
     "meta-device diffusers FluxTransformer2DModel: names, shapes and order "
     "identical; total equals the published 11,901,408,320"),
    ("flux_vae", autoencoder_kl, FLUX_VAE,
     ["black-forest-labs/FLUX.1-dev vae/config.json "
      "(latent_channels 16, no quant_conv/post_quant_conv); "
      "diffusers AutoencoderKL"],
     "meta-device diffusers AutoencoderKL: names, shapes and order identical"),
    ("t5xxl_encoder", t5_encoder, T5XXL,
     ["black-forest-labs/FLUX.1-dev text_encoder_2/config.json "
      "(google/t5-v1_1-xxl, also stabilityai/stable-diffusion-3-medium-diffusers "
      "text_encoder_3); transformers T5EncoderModel",
      "note: shared.weight is tied to encoder.embed_tokens.weight (one tensor, "
      "listed once as named_parameters() does)"],
     "meta-device transformers T5EncoderModel: names, shapes and order "
     "identical; total equals the expected 4,762,310,656 incl. shared embedding"),
    ("umt5xxl_encoder", wan_t5_encoder, UMT5XXL,
     ["Wan-Video/Wan2.1 wan/modules/t5.py umt5_xxl(encoder_only=True) "
      "(T5Encoder; names as in Wan-AI/Wan2.1-T2V-14B "
      "models_t5_umt5-xxl-enc-bf16.pth); the same tensors as transformers "
      "UMT5EncoderModel (Wan-AI/Wan2.1-T2V-14B-Diffusers text_encoder) "
      "under other names",
      "note: WAN 2.2 A14B uses the same encoder checkpoint"],
     "meta-device instantiation of a transcription of the Wan2.1 T5Encoder "
     "constructor code: "
     "names, shapes and order identical; mapped one-to-one onto a meta-device "
     "transformers UMT5EncoderModel (vocab 256384): shapes identical, "
     "totals equal"),
    ("wan21_14b", wan_model, WAN21_14B,
     ["Wan-Video/Wan2.1 wan/modules/model.py WanModel with "
      "wan/configs/wan_t2v_14B.py (Wan-AI/Wan2.1-T2V-14B config.json); "
      "names as in the Wan-AI/Wan2.1-T2V-14B checkpoint",
      "note: WAN 2.2 A14B (Wan-AI/Wan2.2-T2V-A14B) uses two experts of this same "
      "architecture (high_noise_model, low_noise_model): count it twice "
      "for a WAN 2.2 workflow (Wan-Video/Wan2.2 wan/configs/wan_t2v_A14B.py: "
      "same dim/ffn_dim/layers/heads, same T5 and Wan2.1_VAE)"],
     "meta-device instantiation of a transcription of the Wan2.1 WanModel "
     "constructor code: "
     "names, shapes and order identical; converted with diffusers' "
     "convert_wan_transformer_to_diffusers onto a meta-device diffusers "
     "WanTransformer3DModel (Wan2.1-T2V-14B-Diffusers config): every key "
     "and shape matches, totals equal"),
    ("wan21_vae", wan_vae, WAN21_VAE,
     ["Wan-Video/Wan2.1 wan/modules/vae.py WanVAE_ via _video_vae(z_dim=16) "
      "(names as in Wan-AI/Wan2.1-T2V-14B Wan2.1_VAE.pth)",
      "note: WAN 2.2 A14B uses this VAE too"],
     "meta-device instantiation of a transcription of the Wan2.1 WanVAE_ "
     "constructor code: "
     "names, shapes and order identical; converted with diffusers' "
     "convert_wan_vae_to_diffusers onto a meta-device diffusers "
     "AutoencoderKLWan: every key and shape matches, totals equal"),
]

# (parameters, tensors) of each model as counted on the meta-device
# instantiation of its reference implementation (verify_model_params.py);
# render() refuses to write a file whose totals differ.
EXPECTED: dict[str, tuple[int, int]] = {
    "sdxl_unet": (2_567_463_684, 1680),
    "sdxl_refiner_unet": (2_259_526_660, 1220),
    "sdxl_vae": (83_653_863, 248),
    "clip_l": (123_060_480, 196),
    "clip_g": (694_659_840, 517),
    "flux1_dev": (11_901_408_320, 1160),
    "flux_vae": (83_819_683, 244),
    "t5xxl_encoder": (4_762_310_656, 219),
    "umt5xxl_encoder": (5_680_910_336, 242),
    "wan21_14b": (14_288_491_584, 1095),
    "wan21_vae": (126_892_531, 194),
}


def build(model_id: str) -> list[tuple[str, tuple[int, ...]]]:
    for mid, fn, cfg, _src, _ver in MODELS:
        if mid == model_id:
            P = Params()
            fn(P, cfg)
            return P.rows
    raise KeyError(model_id)


def shape_str(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)


def render() -> str:
    out: list[str] = []
    body: list[str] = []
    summary: list[str] = []
    for mid, _fn, _cfg, sources, verified in MODELS:
        rows = build(mid)
        total = sum(math.prod(s) for _, s in rows)
        exp = EXPECTED[mid]
        if exp != (total, len(rows)):
            raise SystemExit(f"{mid}: computed ({total}, {len(rows)}) != "
                             f"verified {exp}")
        summary.append(f"# {mid}: {total} params in {len(rows)} tensors "
                       f"({total * 2} bytes at 2 bytes/param)")
        body.append(f"# --- {mid} ---")
        for s in sources:
            body.append(f"# {s}" if s.startswith("note: ") else f"# source: {s}")
        body.append(f"# total: {total} params, {len(rows)} tensors")
        body.append(f"# verified: {verified}")
        for name, shape in rows:
            body.append(f"{mid},{name},{shape_str(shape)},{math.prod(shape)}")
    out.append("# Parameter tensors of public diffusion-workflow models, in the "
               "reference implementations' named_parameters() order.")
    out.append("# Written by profiling/data/gen_model_params.py (pure Python, "
               "from published config.json hyperparameters); do not edit by hand.")
    out.append("# Verified tensor by tensor against meta-device instantiations "
               "(torch 2.13.0, diffusers 0.42.1, transformers 5.24.0); see README.md.")
    out.extend(summary)
    out.append("model,tensor,shape,numel")
    out.extend(body)
    return "\n".join(out) + "\n"


README_PATH = os.path.join(HERE, "README.md")
TABLE_BEGIN = "<!-- totals:begin (written by gen_model_params.py) -->"
TABLE_END = "<!-- totals:end -->"


def totals_table() -> str:
    lines = ["| model | tensors | parameters | bytes at 2 B/param | GiB |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for mid, *_ in MODELS:
        rows = build(mid)
        total = sum(math.prod(s) for _, s in rows)
        lines.append(f"| `{mid}` | {len(rows)} | {total:,} | {2 * total:,} | "
                     f"{2 * total / 2**30:.2f} |")
    return "\n".join(lines)


def render_readme(current: str) -> str:
    """current README text with the totals table between the markers replaced."""
    a = current.index(TABLE_BEGIN) + len(TABLE_BEGIN)
    b = current.index(TABLE_END)
    return current[:a] + "\n" + totals_table() + "\n" + current[b:]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def main(argv: list[str]) -> int:
    text = render()
    readme = _read(README_PATH)
    new_readme = render_readme(readme) if readme is not None else None
    if "--check" in argv:
        stale = [p for p, cur, new in ((CSV_PATH, _read(CSV_PATH), text),
                                       (README_PATH, readme, new_readme))
                 if cur != new]
        for p in stale:
            print(f"{p} is out of date; run {__file__}")
        if not stale:
            print(f"{CSV_PATH} and the README totals are up to date")
        return 1 if stale else 0
    with open(CSV_PATH, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    print(f"wrote {CSV_PATH}")
    if new_readme is not None and new_readme != readme:
        with open(README_PATH, "w", encoding="utf-8", newline="\n") as f:
            f.write(new_readme)
        print(f"updated the totals table in {README_PATH}")
    for mid, *_ in MODELS:
        rows = build(mid)
        print(f"  {mid:18s} {sum(math.prod(s) for _, s in rows):>15,d} params "
              f"{len(rows):>5d} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
