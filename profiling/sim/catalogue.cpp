#include "profiling/sim/catalogue.h"

#include <stdexcept>

namespace pins::sim {

namespace {

// Sized models: the parameter list (profiling/data/model_params.csv) has no
// per-tensor listing of them, so they are their published parameter count in
// equal layers (the published block count; one more for an LLM's embeddings).
//   sd35         SD3.5 Large, stabilityai/stable-diffusion-3.5-large model card: 8.1B, 38 MMDiT blocks
//   dit20b, vl7b a 20B-class DiT with a 7B VLM encoder (the suite's Qwen-Image-like family)
//   small2b      a 2B distilled model
//   hunyuan13b   HunyuanVideo, tencent/HunyuanVideo model card: 13B; 20 double- and 40 single-stream blocks
//   llava_llama3 its text encoder, llava-llama-3-8b: the Llama 3 8B decoder (8.03B, 32 layers)
//   qwen_image   Qwen-Image, Qwen/Qwen-Image model card: a 20B MMDiT, 60 blocks (20.4B in bf16 files)
//   qwen25vl7b   its text encoder, Qwen2.5-VL-7B-Instruct: 8.29B with its vision tower, 28 layers
//   hidream17b   HiDream-I1, HiDream-ai/HiDream-I1-Full model card: 17B sparse DiT, 16 double- and 32 single-stream blocks
//   llama31_8b   its fourth text encoder, Llama-3.1-8B-Instruct: 8.03B, 32 layers
//   wan22_5b     WAN 2.2 TI2V 5B, Wan-AI/Wan2.2-TI2V-5B model card: a dense 5B model, 30 layers
// The VAEs of the new families are not in the list either; the list's nearest
// (the Wan 2.1 VAE, which Qwen-Image's is built on; Flux's 16-channel VAE)
// stands in for them: under 1% of any workflow's bytes.
const ModelSpec kSpecs[] = {
    {"umt5", "umt5xxl_encoder", 0, 0, 1.0},
    {"wan22_high", "wan21_14b", 0, 0, 4.0},
    {"wan22_low", "wan21_14b", 0, 0, 4.0},
    {"wan21", "wan21_14b", 0, 0, 4.0},
    {"wan_vae", "wan21_vae", 0, 0, 6.0, false},
    {"clip_l", "clip_l", 0, 0, 0.3, false},
    {"clip_g", "clip_g", 0, 0, 0.5, false},
    {"t5xxl", "t5xxl_encoder", 0, 0, 1.0},
    {"flux", "flux1_dev", 0, 0, 2.0},
    {"flux_vae", "flux_vae", 0, 0, 1.5, false},
    {"sdxl_unet", "sdxl_unet", 0, 0, 1.0},
    {"sdxl_refiner", "sdxl_refiner_unet", 0, 0, 1.0},
    {"sdxl_vae", "sdxl_vae", 0, 0, 1.0, false},
    {"sd35", nullptr, 8.1e9, 38, 2.0},
    {"dit20b", nullptr, 20.4e9, 60, 3.0},
    {"vl7b", nullptr, 7.1e9, 28, 1.0},
    {"small2b", nullptr, 2.0e9, 24, 1.0},
    {"hunyuan13b", nullptr, 13.0e9, 60, 4.0},
    {"llava_llama3", nullptr, 8.03e9, 33, 1.0},
    {"qwen_image", nullptr, 20.4e9, 60, 3.0},
    {"qwen25vl7b", nullptr, 8.29e9, 29, 1.0},
    {"hidream17b", nullptr, 17.0e9, 48, 3.0},
    {"llama31_8b", nullptr, 8.03e9, 33, 1.0},
    {"wan22_5b", nullptr, 5.0e9, 30, 4.0},
};

}  // namespace

const ModelSpec& model_spec(const std::string& key) {
  for (const ModelSpec& s : kSpecs)
    if (key == s.key) return s;
  throw std::logic_error("suite: no model spec " + key);
}

const std::vector<Family>& suite_families() {
  static const std::vector<Family> kFamilies = {
      {"wan22", {"umt5"}, {"wan22_high", "wan22_low"}, "wan_vae", {4, 6, 8, 20, 20, 30}},
      {"wan21", {"umt5"}, {"wan21"}, "wan_vae", {4, 8, 20, 30}},
      {"flux", {"clip_l", "t5xxl"}, {"flux"}, "flux_vae", {4, 8, 20, 25, 30}},
      {"sdxl", {"clip_l", "clip_g"}, {"sdxl_unet"}, "sdxl_vae", {20, 25, 30, 40}},
      {"sdxl_refiner", {"clip_l", "clip_g"}, {"sdxl_unet", "sdxl_refiner"}, "sdxl_vae", {25, 30, 40}},
      {"sd35", {"clip_l", "clip_g", "t5xxl"}, {"sd35"}, "flux_vae", {20, 28, 40}},
      {"dit20b", {"vl7b"}, {"dit20b"}, "wan_vae", {8, 20, 30, 50}},
      {"small2b", {"clip_l"}, {"small2b"}, "sdxl_vae", {4, 6, 8}},
  };
  return kFamilies;
}

const std::vector<Family>& unseen_families() {
  // Steps: the model cards' defaults and their distilled variants.
  static const std::vector<Family> kFamilies = {
      {"hunyuan_video", {"llava_llama3", "clip_l"}, {"hunyuan13b"}, "wan_vae", {20, 30, 50}},
      {"qwen_image", {"qwen25vl7b"}, {"qwen_image"}, "wan_vae", {8, 20, 30, 50}},
      {"hidream", {"clip_l", "clip_g", "t5xxl", "llama31_8b"}, {"hidream17b"}, "flux_vae", {16, 28, 50}},
      {"sd35_large", {"clip_l", "clip_g", "t5xxl"}, {"sd35"}, "flux_vae", {28, 40}},
      {"wan22_5b", {"umt5"}, {"wan22_5b"}, "wan_vae", {20, 30, 50}},
      {"flux", {"clip_l", "t5xxl"}, {"flux"}, "flux_vae", {20, 28}},
      {"wan22", {"umt5"}, {"wan22_high", "wan22_low"}, "wan_vae", {8, 20, 30}},
  };
  return kFamilies;
}

}  // namespace pins::sim
