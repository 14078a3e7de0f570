"""Tiny diffusers pipelines with random weights, built offline (no hub download):
a UNet one (DDPMPipeline, UNet2DModel) and a transformer one (DiTPipeline,
DiTTransformer2DModel and an AutoencoderKL). `width` scales their weights
(profiling/bench_diffusers_ram.py builds larger ones the same way)."""
import torch


def ddpm(seed=0, width=8):
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel
    torch.manual_seed(seed)
    unet = UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(width, 2 * width), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4).eval()
    pipe = DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=10))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def dit(seed=0, width=8, layers=2):
    from diffusers import AutoencoderKL, DDIMScheduler, DiTPipeline, DiTTransformer2DModel
    torch.manual_seed(seed)
    transformer = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=width, in_channels=4,
                                        out_channels=8, num_layers=layers, norm_num_groups=4, sample_size=4,
                                        patch_size=2, num_embeds_ada_norm=1000).eval()
    vae = AutoencoderKL(block_out_channels=(width,), down_block_types=("DownEncoderBlock2D",),
                        up_block_types=("UpDecoderBlock2D",), latent_channels=4, norm_num_groups=4,
                        sample_size=8).eval()
    pipe = DiTPipeline(transformer=transformer, vae=vae, scheduler=DDIMScheduler(num_train_timesteps=10))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run(pipe, seed=0, steps=2):
    """One call of `pipe` (a pins prompt when enabled): its image, as a tensor."""
    from diffusers import DiTPipeline
    g = torch.Generator().manual_seed(seed)
    if isinstance(pipe, DiTPipeline):
        out = pipe(class_labels=[1], generator=g, num_inference_steps=steps, output_type="np")
    else:
        out = pipe(batch_size=1, generator=g, num_inference_steps=steps, output_type="np")
    return torch.from_numpy(out.images)


BUILDERS = {"ddpm": ddpm, "dit": dit}
