"""Write a tiny random-weight MiniMax-H3 in the diffusers folder layout real weights use.

Tests and the demo load it through exactly the path real weights take (`model.load_model`),
so what they exercise is the loading, the orchestration and the I/O, not a mock. The configs
are the smallest known to run on a CPU with diffusers 0.42.1: a 22-frame 64x64 clip in about a
second. The text encoder is a Qwen3-VL with 51 decoder layers because MiniMax-H3 reads hidden
state 50; its tokenizer is byte-level BPE with no merges, built here, so nothing is fetched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TRANSFORMER = dict(
    num_attention_heads=2,
    attention_head_dim=32,
    hidden_size=64,
    num_layers=2,
    num_refiner_layers=1,
    ffn_dim=128,
    in_channels=8,
    audio_in_channels=8,
    patch_size=(1, 2, 2),
    text_dim=32,
    freq_dim=32,
    time_embed_hidden_dim=64,
    time_embed_dim=32,
    rope_freq_dim=4,
)
VAE = dict(
    latent_channels=8,
    block_out_channels=(8, 8, 16, 16),
    layers_per_block=1,
    spatial_downsample_factors=(2, 2, 2, 2),
    temporal_downsample_factors=(1, 2, 2, 1),
    norm_num_groups=4,
    decoder_num_layers=1,
    decoder_num_attention_heads=2,
    decoder_attention_head_dim=16,
    decoder_num_register_tokens=2,
    decoder_ffn_mult=2,
    clip_length=17,
    token_drop=3,
    latents_mean=(0.0,) * 8,
    latents_std=(1.0,) * 8,
)
AUDIO_VAE = dict(
    encoder_dim=4,
    encoder_rates=(2, 4, 4, 5, 5),
    latent_dim=16,
    latent_channels=8,
    num_attention_heads=2,
    decoder_dim=128,
    decoder_rates=(5, 5, 2, 2, 2, 2, 2),
    decoder_kernel_sizes=(9, 9, 4, 4, 4, 4, 4),
    resblock_kernel_sizes=(3,),
    resblock_dilation_sizes=((1, 3, 5),),
    sampling_rate=32000,
    latents_mean=(0.0,) * 8,
    latents_std=(1.0,) * 8,
)
TEXT_LAYERS = 51  # MiniMax-H3 reads hidden_states[50]
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# The tiny model has no training behind it, so the 5-15 s window the released model keeps is
# meaningless for it; it declares its own (see model.ModelFacts).
FACTS: dict[str, Any] = {"name": "minimax-h3-tiny", "min_seconds": 0.0, "max_seconds": 15.0}


def make_tiny(out: Path, *, seed: int = 0, transformer: dict | None = None) -> Path:
    """Write the tiny model into `out` (created; must be empty or absent). Returns `out`.

    `transformer` overrides entries of its config, e.g. `{"attention_head_dim": 64}` for the kernels
    that take head dims 64/96/128 only."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):  # before the imports below, which take seconds
        raise FileExistsError(f"{out} is not empty")
    import torch
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Scheduler,
        MiniMaxH3Transformer3DModel,
    )
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from h3core.executors.pipeline.model import FACTS_FILE, image_processor_class, quiet_progress_bars

    quiet_progress_bars()
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tokenizer = _tokenizer()
    token = tokenizer.convert_tokens_to_ids
    text_encoder = Qwen3VLForConditionalGeneration(
        Qwen3VLConfig(
            text_config=dict(
                vocab_size=len(tokenizer),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=TEXT_LAYERS,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=16,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "mrope_section": [2, 3, 3],
                    "mrope_interleaved": True,
                },
                max_position_embeddings=4096,
            ),
            vision_config=dict(
                depth=1,
                hidden_size=32,
                intermediate_size=64,
                num_heads=2,
                out_hidden_size=32,
                patch_size=16,
                temporal_patch_size=2,
                spatial_merge_size=2,
                num_position_embeddings=64,
                deepstack_visual_indexes=[0],
            ),
            image_token_id=token("<|image_pad|>"),
            video_token_id=token("<|video_pad|>"),
            vision_start_token_id=token("<|vision_start|>"),
            vision_end_token_id=token("<|vision_end|>"),
        )
    )
    parts = {
        "transformer": MiniMaxH3Transformer3DModel(**{**TRANSFORMER, **(transformer or {})}),
        "transformer_ref": MiniMaxH3Transformer3DModel(**{**TRANSFORMER, **(transformer or {})}),
        "vae": AutoencoderKLMiniMaxH3(**VAE),
        "audio_vae": AutoencoderKLMiniMaxH3Audio(**AUDIO_VAE),
        "scheduler": MiniMaxH3Scheduler(shift=12.0),
        "audio_scheduler": MiniMaxH3Scheduler(shift=3.0),
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
        "processor": image_processor_class()(patch_size=16, temporal_patch_size=2, merge_size=2),
    }
    for name, part in parts.items():
        part.save_pretrained(out / name)
    (out / FACTS_FILE).write_text(json.dumps(FACTS, indent=2) + "\n")
    return out


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import Qwen2TokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return Qwen2TokenizerFast(
        tokenizer_object=tok,
        unk_token=None,
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
        },
    )
