"""Node registry of the fake ComfyUI (`h3core/testing/comfyui.py`): input specs per class, as data.

`STOCK_NODES` was copied verbatim from `GET /object_info` of a stock ComfyUI 0.3.64 (the recording
of h3core/testing/comfyui_protocol/; its 488 KB object_info.json is not copied), except that
`CLIPLoader.type` also lists "minimax". The sampler and scheduler lists are shared constants only to keep this file short.
`EXTRA_NODES` are written by hand: classes of MiniMax-H3 and Raylight, and two stock audio classes
that the recorded server did not load (its torchaudio import failed). Their specs follow the
workflow templates in `h3core/executors/comfyui/workflows/`; defaults and ranges not given there
are plausible guesses.

Combo lists that depend on files (`LoadImage.image`, `LoadVideo.file`, `LoadAudio.audio`, model
names) are filled in at request time by the fake; see `FILE_INPUTS` and `MODEL_INPUTS`.
"""

from __future__ import annotations

import copy
from typing import Any

SAMPLERS = [
    "euler",
    "euler_cfg_pp",
    "euler_ancestral",
    "euler_ancestral_cfg_pp",
    "heun",
    "heunpp2",
    "dpm_2",
    "dpm_2_ancestral",
    "lms",
    "dpm_fast",
    "dpm_adaptive",
    "dpmpp_2s_ancestral",
    "dpmpp_2s_ancestral_cfg_pp",
    "dpmpp_sde",
    "dpmpp_sde_gpu",
    "dpmpp_2m",
    "dpmpp_2m_cfg_pp",
    "dpmpp_2m_sde",
    "dpmpp_2m_sde_gpu",
    "dpmpp_2m_sde_heun",
    "dpmpp_2m_sde_heun_gpu",
    "dpmpp_3m_sde",
    "dpmpp_3m_sde_gpu",
    "ddpm",
    "lcm",
    "ipndm",
    "ipndm_v",
    "deis",
    "res_multistep",
    "res_multistep_cfg_pp",
    "res_multistep_ancestral",
    "res_multistep_ancestral_cfg_pp",
    "gradient_estimation",
    "gradient_estimation_cfg_pp",
    "er_sde",
    "seeds_2",
    "seeds_3",
    "sa_solver",
    "sa_solver_pece",
    "ddim",
    "uni_pc",
    "uni_pc_bh2",
]
SCHEDULERS = [
    "simple",
    "sgm_uniform",
    "karras",
    "exponential",
    "ddim_uniform",
    "beta",
    "normal",
    "linear_quadratic",
    "kl_optimal",
]

STOCK_NODES: dict[str, dict[str, Any]] = {
    "EmptyImage": {
        "input": {
            "required": {
                "width": ["INT", {"default": 512, "min": 1, "max": 16384, "step": 1}],
                "height": ["INT", {"default": 512, "min": 1, "max": 16384, "step": 1}],
                "batch_size": ["INT", {"default": 1, "min": 1, "max": 4096}],
                "color": ["INT", {"default": 0, "min": 0, "max": 16777215, "step": 1, "display": "color"}],
            }
        },
        "input_order": {"required": ["width", "height", "batch_size", "color"]},
        "output": ["IMAGE"],
        "output_is_list": [False],
        "output_name": ["IMAGE"],
        "name": "EmptyImage",
        "display_name": "EmptyImage",
        "description": "",
        "python_module": "nodes",
        "category": "image",
        "output_node": False,
    },
    "ImageBlur": {
        "input": {
            "required": {
                "image": ["IMAGE", {}],
                "blur_radius": ["INT", {"default": 1, "min": 1, "max": 31, "step": 1}],
                "sigma": ["FLOAT", {"default": 1.0, "min": 0.1, "max": 10.0, "step": 0.1}],
            }
        },
        "input_order": {"required": ["image", "blur_radius", "sigma"]},
        "output": ["IMAGE"],
        "output_is_list": [False],
        "output_name": ["IMAGE"],
        "output_tooltips": [None],
        "name": "ImageBlur",
        "display_name": None,
        "description": "",
        "python_module": "comfy_extras.nodes_post_processing",
        "category": "image/postprocessing",
        "output_node": False,
        "deprecated": False,
        "experimental": False,
        "api_node": False,
    },
    "ImageScale": {
        "input": {
            "required": {
                "image": ["IMAGE"],
                "upscale_method": [["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]],
                "width": ["INT", {"default": 512, "min": 0, "max": 16384, "step": 1}],
                "height": ["INT", {"default": 512, "min": 0, "max": 16384, "step": 1}],
                "crop": [["disabled", "center"]],
            }
        },
        "input_order": {"required": ["image", "upscale_method", "width", "height", "crop"]},
        "output": ["IMAGE"],
        "output_is_list": [False],
        "output_name": ["IMAGE"],
        "name": "ImageScale",
        "display_name": "Upscale Image",
        "description": "",
        "python_module": "nodes",
        "category": "image/upscaling",
        "output_node": False,
    },
    "SaveImage": {
        "input": {
            "required": {
                "images": ["IMAGE", {"tooltip": "The images to save."}],
                "filename_prefix": [
                    "STRING",
                    {
                        "default": "ComfyUI",
                        "tooltip": "The prefix for the file to save. This may include "
                        "formatting information such as %date:yyyy-MM-dd% or "
                        "%Empty Latent Image.width% to include values from "
                        "nodes.",
                    },
                ],
            },
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        },
        "input_order": {"required": ["images", "filename_prefix"], "hidden": ["prompt", "extra_pnginfo"]},
        "output": [],
        "output_is_list": [],
        "output_name": [],
        "name": "SaveImage",
        "display_name": "Save Image",
        "description": "Saves the input images to your ComfyUI output directory.",
        "python_module": "nodes",
        "category": "image",
        "output_node": True,
    },
    "PreviewImage": {
        "input": {"required": {"images": ["IMAGE"]}, "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"}},
        "input_order": {"required": ["images"], "hidden": ["prompt", "extra_pnginfo"]},
        "output": [],
        "output_is_list": [],
        "output_name": [],
        "name": "PreviewImage",
        "display_name": "Preview Image",
        "description": "Saves the input images to your ComfyUI output directory.",
        "python_module": "nodes",
        "category": "image",
        "output_node": True,
    },
    "SaveAnimatedWEBP": {
        "input": {
            "required": {
                "images": ["IMAGE"],
                "filename_prefix": ["STRING", {"default": "ComfyUI"}],
                "fps": ["FLOAT", {"default": 6.0, "min": 0.01, "max": 1000.0, "step": 0.01}],
                "lossless": ["BOOLEAN", {"default": True}],
                "quality": ["INT", {"default": 80, "min": 0, "max": 100}],
                "method": [["default", "fastest", "slowest"]],
            },
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        },
        "input_order": {
            "required": ["images", "filename_prefix", "fps", "lossless", "quality", "method"],
            "hidden": ["prompt", "extra_pnginfo"],
        },
        "output": [],
        "output_is_list": [],
        "output_name": [],
        "name": "SaveAnimatedWEBP",
        "display_name": "SaveAnimatedWEBP",
        "description": "",
        "python_module": "comfy_extras.nodes_images",
        "category": "image/animation",
        "output_node": True,
    },
    "SaveImageWebsocket": {
        "input": {"required": {"images": ["IMAGE"]}},
        "input_order": {"required": ["images"]},
        "output": [],
        "output_is_list": [],
        "output_name": [],
        "name": "SaveImageWebsocket",
        "display_name": "SaveImageWebsocket",
        "description": "",
        "python_module": "custom_nodes.websocket_image_save",
        "category": "api/image",
        "output_node": True,
    },
    "RebatchImages": {
        "input": {"required": {"images": ["IMAGE", {}], "batch_size": ["INT", {"default": 1, "min": 1, "max": 4096}]}},
        "input_order": {"required": ["images", "batch_size"]},
        "output": ["IMAGE"],
        "output_is_list": [True],
        "output_name": ["IMAGE"],
        "output_tooltips": [None],
        "name": "RebatchImages",
        "display_name": "Rebatch Images",
        "description": "",
        "python_module": "comfy_extras.nodes_rebatch",
        "category": "image/batch",
        "output_node": False,
        "deprecated": False,
        "experimental": False,
        "api_node": False,
    },
    "LoadImage": {
        "input": {"required": {"image": [["example.png"], {"image_upload": True}]}},
        "input_order": {"required": ["image"]},
        "output": ["IMAGE", "MASK"],
        "output_is_list": [False, False],
        "output_name": ["IMAGE", "MASK"],
        "name": "LoadImage",
        "display_name": "Load Image",
        "description": "",
        "python_module": "nodes",
        "category": "image",
        "output_node": False,
    },
    "EmptyLatentImage": {
        "input": {
            "required": {
                "width": [
                    "INT",
                    {"default": 512, "min": 16, "max": 16384, "step": 8, "tooltip": "The width of the latent images in pixels."},
                ],
                "height": [
                    "INT",
                    {"default": 512, "min": 16, "max": 16384, "step": 8, "tooltip": "The height of the latent images in pixels."},
                ],
                "batch_size": [
                    "INT",
                    {"default": 1, "min": 1, "max": 4096, "tooltip": "The number of latent images in the batch."},
                ],
            }
        },
        "input_order": {"required": ["width", "height", "batch_size"]},
        "output": ["LATENT"],
        "output_is_list": [False],
        "output_name": ["LATENT"],
        "name": "EmptyLatentImage",
        "display_name": "Empty Latent Image",
        "description": "Create a new batch of empty latent images to be denoised via sampling.",
        "python_module": "nodes",
        "category": "latent",
        "output_node": False,
        "output_tooltips": ["The empty latent image batch."],
    },
    "CheckpointLoaderSimple": {
        "input": {"required": {"ckpt_name": [[], {"tooltip": "The name of the checkpoint (model) to load."}]}},
        "input_order": {"required": ["ckpt_name"]},
        "output": ["MODEL", "CLIP", "VAE"],
        "output_is_list": [False, False, False],
        "output_name": ["MODEL", "CLIP", "VAE"],
        "name": "CheckpointLoaderSimple",
        "display_name": "Load Checkpoint",
        "description": "Loads a diffusion model checkpoint, diffusion models are used to denoise latents.",
        "python_module": "nodes",
        "category": "loaders",
        "output_node": False,
        "output_tooltips": [
            "The model used for denoising latents.",
            "The CLIP model used for encoding text prompts.",
            "The VAE model used for encoding and decoding images to and from latent space.",
        ],
    },
    "CLIPTextEncode": {
        "input": {
            "required": {
                "text": ["STRING", {"multiline": True, "dynamicPrompts": True, "tooltip": "The text to be encoded."}],
                "clip": ["CLIP", {"tooltip": "The CLIP model used for encoding the text."}],
            }
        },
        "input_order": {"required": ["text", "clip"]},
        "output": ["CONDITIONING"],
        "output_is_list": [False],
        "output_name": ["CONDITIONING"],
        "name": "CLIPTextEncode",
        "display_name": "CLIP Text Encode (Prompt)",
        "description": "Encodes a text prompt using a CLIP model into an embedding that can be used to guide "
        "the diffusion model towards generating specific images.",
        "python_module": "nodes",
        "category": "conditioning",
        "output_node": False,
        "output_tooltips": ["A conditioning containing the embedded text used to guide the diffusion model."],
    },
    "KSampler": {
        "input": {
            "required": {
                "model": ["MODEL", {"tooltip": "The model used for denoising the input latent."}],
                "seed": [
                    "INT",
                    {
                        "default": 0,
                        "min": 0,
                        "max": 18446744073709551615,
                        "control_after_generate": True,
                        "tooltip": "The random seed used for creating the noise.",
                    },
                ],
                "steps": [
                    "INT",
                    {"default": 20, "min": 1, "max": 10000, "tooltip": "The number of steps used in the denoising process."},
                ],
                "cfg": [
                    "FLOAT",
                    {
                        "default": 8.0,
                        "min": 0.0,
                        "max": 100.0,
                        "step": 0.1,
                        "round": 0.01,
                        "tooltip": "The Classifier-Free Guidance scale balances creativity and "
                        "adherence to the prompt. Higher values result in images more "
                        "closely matching the prompt however too high values will "
                        "negatively impact quality.",
                    },
                ],
                "sampler_name": [
                    SAMPLERS,
                    {
                        "tooltip": "The algorithm used when sampling, this can affect the "
                        "quality, speed, and style of the generated output."
                    },
                ],
                "scheduler": [
                    SCHEDULERS,
                    {"tooltip": "The scheduler controls how noise is gradually removed to form the image."},
                ],
                "positive": [
                    "CONDITIONING",
                    {"tooltip": "The conditioning describing the attributes you want to include in the image."},
                ],
                "negative": [
                    "CONDITIONING",
                    {"tooltip": "The conditioning describing the attributes you want to exclude from the image."},
                ],
                "latent_image": ["LATENT", {"tooltip": "The latent image to denoise."}],
                "denoise": [
                    "FLOAT",
                    {
                        "default": 1.0,
                        "min": 0.0,
                        "max": 1.0,
                        "step": 0.01,
                        "tooltip": "The amount of denoising applied, lower values will maintain "
                        "the structure of the initial image allowing for image to "
                        "image sampling.",
                    },
                ],
            }
        },
        "input_order": {
            "required": [
                "model",
                "seed",
                "steps",
                "cfg",
                "sampler_name",
                "scheduler",
                "positive",
                "negative",
                "latent_image",
                "denoise",
            ]
        },
        "output": ["LATENT"],
        "output_is_list": [False],
        "output_name": ["LATENT"],
        "name": "KSampler",
        "display_name": "KSampler",
        "description": "Uses the provided model, positive and negative conditioning to denoise the latent image.",
        "python_module": "nodes",
        "category": "sampling",
        "output_node": False,
        "output_tooltips": ["The denoised latent."],
    },
    "KSamplerAdvanced": {
        "input": {
            "required": {
                "model": ["MODEL"],
                "add_noise": [["enable", "disable"]],
                "noise_seed": ["INT", {"default": 0, "min": 0, "max": 18446744073709551615, "control_after_generate": True}],
                "steps": ["INT", {"default": 20, "min": 1, "max": 10000}],
                "cfg": ["FLOAT", {"default": 8.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01}],
                "sampler_name": [SAMPLERS],
                "scheduler": [SCHEDULERS],
                "positive": ["CONDITIONING"],
                "negative": ["CONDITIONING"],
                "latent_image": ["LATENT"],
                "start_at_step": ["INT", {"default": 0, "min": 0, "max": 10000}],
                "end_at_step": ["INT", {"default": 10000, "min": 0, "max": 10000}],
                "return_with_leftover_noise": [["disable", "enable"]],
            }
        },
        "input_order": {
            "required": [
                "model",
                "add_noise",
                "noise_seed",
                "steps",
                "cfg",
                "sampler_name",
                "scheduler",
                "positive",
                "negative",
                "latent_image",
                "start_at_step",
                "end_at_step",
                "return_with_leftover_noise",
            ]
        },
        "output": ["LATENT"],
        "output_is_list": [False],
        "output_name": ["LATENT"],
        "name": "KSamplerAdvanced",
        "display_name": "KSampler (Advanced)",
        "description": "",
        "python_module": "nodes",
        "category": "sampling",
        "output_node": False,
    },
    "VAEDecode": {
        "input": {
            "required": {
                "samples": ["LATENT", {"tooltip": "The latent to be decoded."}],
                "vae": ["VAE", {"tooltip": "The VAE model used for decoding the latent."}],
            }
        },
        "input_order": {"required": ["samples", "vae"]},
        "output": ["IMAGE"],
        "output_is_list": [False],
        "output_name": ["IMAGE"],
        "name": "VAEDecode",
        "display_name": "VAE Decode",
        "description": "Decodes latent images back into pixel space images.",
        "python_module": "nodes",
        "category": "latent",
        "output_node": False,
        "output_tooltips": ["The decoded image."],
    },
    "VAEEncode": {
        "input": {"required": {"pixels": ["IMAGE"], "vae": ["VAE"]}},
        "input_order": {"required": ["pixels", "vae"]},
        "output": ["LATENT"],
        "output_is_list": [False],
        "output_name": ["LATENT"],
        "name": "VAEEncode",
        "display_name": "VAE Encode",
        "description": "",
        "python_module": "nodes",
        "category": "latent",
        "output_node": False,
    },
    "UNETLoader": {
        "input": {"required": {"unet_name": [[]], "weight_dtype": [["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"]]}},
        "input_order": {"required": ["unet_name", "weight_dtype"]},
        "output": ["MODEL"],
        "output_is_list": [False],
        "output_name": ["MODEL"],
        "name": "UNETLoader",
        "display_name": "Load Diffusion Model",
        "description": "",
        "python_module": "nodes",
        "category": "advanced/loaders",
        "output_node": False,
    },
    "CLIPLoader": {
        "input": {
            "required": {
                "clip_name": [[]],
                "type": [
                    [
                        "stable_diffusion",
                        "stable_cascade",
                        "sd3",
                        "stable_audio",
                        "mochi",
                        "ltxv",
                        "pixart",
                        "cosmos",
                        "lumina2",
                        "wan",
                        "hidream",
                        "chroma",
                        "ace",
                        "omnigen2",
                        "qwen_image",
                        "hunyuan_image",
                    ]
                ],
            },
            "optional": {"device": [["default", "cpu"], {"advanced": True}]},
        },
        "input_order": {"required": ["clip_name", "type"], "optional": ["device"]},
        "output": ["CLIP"],
        "output_is_list": [False],
        "output_name": ["CLIP"],
        "name": "CLIPLoader",
        "display_name": "Load CLIP",
        "description": "[Recipes]\n"
        "\n"
        "stable_diffusion: clip-l\n"
        "stable_cascade: clip-g\n"
        "sd3: t5 xxl/ clip-g / clip-l\n"
        "stable_audio: t5 base\n"
        "mochi: t5 xxl\n"
        "cosmos: old t5 xxl\n"
        "lumina2: gemma 2 2B\n"
        "wan: umt5 xxl\n"
        " hidream: llama-3.1 (Recommend) or t5\n"
        "omnigen2: qwen vl 2.5 3B",
        "python_module": "nodes",
        "category": "advanced/loaders",
        "output_node": False,
    },
    "VAELoader": {
        "input": {"required": {"vae_name": [["pixel_space"]]}},
        "input_order": {"required": ["vae_name"]},
        "output": ["VAE"],
        "output_is_list": [False],
        "output_name": ["VAE"],
        "name": "VAELoader",
        "display_name": "Load VAE",
        "description": "",
        "python_module": "nodes",
        "category": "loaders",
        "output_node": False,
    },
    "RandomNoise": {
        "input": {
            "required": {
                "noise_seed": ["INT", {"default": 0, "min": 0, "max": 18446744073709551615, "control_after_generate": True}]
            }
        },
        "input_order": {"required": ["noise_seed"]},
        "output": ["NOISE"],
        "output_is_list": [False],
        "output_name": ["NOISE"],
        "name": "RandomNoise",
        "display_name": "RandomNoise",
        "description": "",
        "python_module": "comfy_extras.nodes_custom_sampler",
        "category": "sampling/custom_sampling/noise",
        "output_node": False,
    },
    "BasicGuider": {
        "input": {"required": {"model": ["MODEL"], "conditioning": ["CONDITIONING"]}},
        "input_order": {"required": ["model", "conditioning"]},
        "output": ["GUIDER"],
        "output_is_list": [False],
        "output_name": ["GUIDER"],
        "name": "BasicGuider",
        "display_name": "BasicGuider",
        "description": "",
        "python_module": "comfy_extras.nodes_custom_sampler",
        "category": "sampling/custom_sampling/guiders",
        "output_node": False,
    },
    "KSamplerSelect": {
        "input": {"required": {"sampler_name": [SAMPLERS]}},
        "input_order": {"required": ["sampler_name"]},
        "output": ["SAMPLER"],
        "output_is_list": [False],
        "output_name": ["SAMPLER"],
        "name": "KSamplerSelect",
        "display_name": "KSamplerSelect",
        "description": "",
        "python_module": "comfy_extras.nodes_custom_sampler",
        "category": "sampling/custom_sampling/samplers",
        "output_node": False,
    },
    "BasicScheduler": {
        "input": {
            "required": {
                "model": ["MODEL"],
                "scheduler": [SCHEDULERS],
                "steps": ["INT", {"default": 20, "min": 1, "max": 10000}],
                "denoise": ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01}],
            }
        },
        "input_order": {"required": ["model", "scheduler", "steps", "denoise"]},
        "output": ["SIGMAS"],
        "output_is_list": [False],
        "output_name": ["SIGMAS"],
        "name": "BasicScheduler",
        "display_name": "BasicScheduler",
        "description": "",
        "python_module": "comfy_extras.nodes_custom_sampler",
        "category": "sampling/custom_sampling/schedulers",
        "output_node": False,
    },
    "SamplerCustomAdvanced": {
        "input": {
            "required": {
                "noise": ["NOISE"],
                "guider": ["GUIDER"],
                "sampler": ["SAMPLER"],
                "sigmas": ["SIGMAS"],
                "latent_image": ["LATENT"],
            }
        },
        "input_order": {"required": ["noise", "guider", "sampler", "sigmas", "latent_image"]},
        "output": ["LATENT", "LATENT"],
        "output_is_list": [False, False],
        "output_name": ["output", "denoised_output"],
        "name": "SamplerCustomAdvanced",
        "display_name": "SamplerCustomAdvanced",
        "description": "",
        "python_module": "comfy_extras.nodes_custom_sampler",
        "category": "sampling/custom_sampling",
        "output_node": False,
    },
    "CreateVideo": {
        "input": {
            "required": {
                "images": ["IMAGE", {"tooltip": "The images to create a video from."}],
                "fps": ["FLOAT", {"default": 30.0, "min": 1.0, "max": 120.0, "step": 1.0}],
            },
            "optional": {"audio": ["AUDIO", {"tooltip": "The audio to add to the video."}]},
        },
        "input_order": {"required": ["images", "fps"], "optional": ["audio"]},
        "output": ["VIDEO"],
        "output_is_list": [False],
        "output_name": ["VIDEO"],
        "output_tooltips": [None],
        "name": "CreateVideo",
        "display_name": "Create Video",
        "description": "Create a video from images.",
        "python_module": "comfy_extras.nodes_video",
        "category": "image/video",
        "output_node": False,
        "deprecated": False,
        "experimental": False,
        "api_node": False,
    },
    "SaveVideo": {
        "input": {
            "required": {
                "video": ["VIDEO", {"tooltip": "The video to save."}],
                "filename_prefix": [
                    "STRING",
                    {
                        "tooltip": "The prefix for the file to save. This may include "
                        "formatting information such as %date:yyyy-MM-dd% or "
                        "%Empty Latent Image.width% to include values from "
                        "nodes.",
                        "default": "video/ComfyUI",
                        "multiline": False,
                    },
                ],
                "format": [
                    "COMBO",
                    {
                        "tooltip": "The format to save the video as.",
                        "default": "auto",
                        "multiselect": False,
                        "options": ["auto", "mp4"],
                    },
                ],
                "codec": [
                    "COMBO",
                    {
                        "tooltip": "The codec to use for the video.",
                        "default": "auto",
                        "multiselect": False,
                        "options": ["auto", "h264"],
                    },
                ],
            },
            "hidden": {"prompt": ["PROMPT"], "extra_pnginfo": ["EXTRA_PNGINFO"]},
        },
        "input_order": {"required": ["video", "filename_prefix", "format", "codec"], "hidden": ["prompt", "extra_pnginfo"]},
        "output": [],
        "output_is_list": [],
        "output_name": [],
        "output_tooltips": [],
        "name": "SaveVideo",
        "display_name": "Save Video",
        "description": "Saves the input images to your ComfyUI output directory.",
        "python_module": "comfy_extras.nodes_video",
        "category": "image/video",
        "output_node": True,
        "deprecated": False,
        "experimental": False,
        "api_node": False,
    },
    "LoadVideo": {
        "input": {"required": {"file": ["COMBO", {"multiselect": False, "options": [], "video_upload": True}]}},
        "input_order": {"required": ["file"]},
        "output": ["VIDEO"],
        "output_is_list": [False],
        "output_name": ["VIDEO"],
        "output_tooltips": [None],
        "name": "LoadVideo",
        "display_name": "Load Video",
        "description": "",
        "python_module": "comfy_extras.nodes_video",
        "category": "image/video",
        "output_node": False,
        "deprecated": False,
        "experimental": False,
        "api_node": False,
    },
    "GetVideoComponents": {
        "input": {"required": {"video": ["VIDEO", {"tooltip": "The video to extract components from."}]}},
        "input_order": {"required": ["video"]},
        "output": ["IMAGE", "AUDIO", "FLOAT"],
        "output_is_list": [False, False, False],
        "output_name": ["images", "audio", "fps"],
        "output_tooltips": [None, None, None],
        "name": "GetVideoComponents",
        "display_name": "Get Video Components",
        "description": "Extracts all components from a video: frames, audio, and framerate.",
        "python_module": "comfy_extras.nodes_video",
        "category": "image/video",
        "output_node": False,
        "deprecated": False,
        "experimental": False,
        "api_node": False,
    },
}


_U64 = 18446744073709551615


def _node(
    name: str,
    required: dict[str, list[Any]],
    optional: dict[str, list[Any]] | None = None,
    output: tuple[str, ...] = (),
    output_name: tuple[str, ...] | None = None,
    *,
    category: str,
    module: str,
    display_name: str | None = None,
    output_node: bool = False,
    description: str = "",
) -> dict[str, Any]:
    inputs: dict[str, Any] = {"required": required}
    order: dict[str, list[str]] = {"required": list(required)}
    if optional:
        inputs["optional"] = optional
        order["optional"] = list(optional)
    return {
        "input": inputs,
        "input_order": order,
        "output": list(output),
        "output_is_list": [False] * len(output),
        "output_name": list(output_name or output),
        "name": name,
        "display_name": display_name or name,
        "description": description,
        "python_module": module,
        "category": category,
        "output_node": output_node,
    }


def _size(default: int) -> list[Any]:
    return ["INT", {"default": default, "min": 32, "max": 4096, "step": 32}]


_MINIMAX_COMMON: dict[str, list[Any]] = {
    "prompt": ["STRING", {"multiline": True, "dynamicPrompts": True, "default": ""}],
    "width": _size(1344),
    "height": _size(768),
    "length": ["INT", {"default": 124, "min": 5, "max": 3600, "step": 1}],
}

_REF_INPUTS: dict[str, list[Any]] = {
    **{f"ref_images.ref_image_{i}": ["IMAGE"] for i in range(9)},
    **{f"ref_videos.ref_video_{i}": ["IMAGE"] for i in range(3)},
    **{f"ref_video_audios.ref_video_audio_{i}": ["AUDIO"] for i in range(3)},
    **{f"ref_audios.ref_audio_{i}": ["AUDIO"] for i in range(3)},
}

_RAY = "custom_nodes.raylight"

EXTRA_NODES: dict[str, dict[str, Any]] = {
    "VAEDecodeAudio": _node(
        "VAEDecodeAudio",
        {"samples": ["LATENT"], "vae": ["VAE"]},
        None,
        ("AUDIO",),
        category="latent/audio",
        module="comfy_extras.nodes_audio",
        display_name="VAE Decode Audio",
    ),
    "LoadAudio": _node(
        "LoadAudio",
        {"audio": [[], {"audio_upload": True}]},
        None,
        ("AUDIO",),
        category="audio",
        module="comfy_extras.nodes_audio",
        display_name="Load Audio",
    ),
    "MiniMaxH3ImageToVideo": _node(
        "MiniMaxH3ImageToVideo",
        {"clip": ["CLIP"], "vae": ["VAE"], **_MINIMAX_COMMON},
        {"first_frame": ["IMAGE"], "last_frame": ["IMAGE"]},
        ("CONDITIONING", "LATENT"),
        ("positive", "latent"),
        category="conditioning/video_models",
        module="comfy_extras.nodes_minimax_h3",
    ),
    "MiniMaxH3ReferenceToVideo": _node(
        "MiniMaxH3ReferenceToVideo",
        {"clip": ["CLIP"], "vae": ["VAE"], "audio_vae": ["VAE"], **_MINIMAX_COMMON, "ref_image_size": [["match", "max"]]},
        _REF_INPUTS,
        ("CONDITIONING", "LATENT"),
        ("positive", "latent"),
        category="conditioning/video_models",
        module="comfy_extras.nodes_minimax_h3",
    ),
    "RayInitializer": _node(
        "RayInitializer",
        {
            "ray_cluster_address": ["STRING", {"default": "local"}],
            "ray_cluster_namespace": ["STRING", {"default": "default"}],
            "GPU": ["INT", {"default": 2, "min": 1, "max": 64}],
            "ulysses_degree": ["INT", {"default": 2, "min": 1, "max": 64}],
            "ring_degree": ["INT", {"default": 1, "min": 1, "max": 64}],
            "cfg_degree": ["INT", {"default": 1, "min": 1, "max": 2}],
            "dp_degree": ["INT", {"default": 1, "min": 1, "max": 64}],
            "sync_ulysses": ["BOOLEAN", {"default": False}],
            "clear_vram_after_sampling": ["BOOLEAN", {"default": False}],
            "FSDP": ["BOOLEAN", {"default": False}],
            "FSDP_CPU_OFFLOAD": ["BOOLEAN", {"default": False}],
            "XFuser_attention": [["TORCH_FLASH", "SAGE_FP16", "FA", "TORCH"], {"default": "TORCH"}],
            "skip_comm_test": ["BOOLEAN", {"default": False}],
            "use_mmap": ["BOOLEAN", {"default": True}],
        },
        None,
        ("RAY_ACTORS_INIT",),
        ("ray_actors_init",),
        category="Raylight",
        module=_RAY,
    ),
    "RayUNETLoader": _node(
        "RayUNETLoader",
        {
            "unet_name": [[]],
            "weight_dtype": [["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"]],
            "ray_actors_init": ["RAY_ACTORS_INIT"],
        },
        None,
        ("RAY_ACTORS",),
        ("ray_actors",),
        category="Raylight",
        module=_RAY,
    ),
    "RayBasicGuider": _node(
        "RayBasicGuider",
        {"ray_actors": ["RAY_ACTORS"], "conditioning": ["CONDITIONING"]},
        None,
        ("GUIDER",),
        category="Raylight",
        module=_RAY,
    ),
    "RayBasicScheduler": _node(
        "RayBasicScheduler",
        {
            "ray_actors": ["RAY_ACTORS"],
            "scheduler": [SCHEDULERS],
            "steps": ["INT", {"default": 20, "min": 1, "max": 10000}],
            "denoise": ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01}],
        },
        None,
        ("SIGMAS",),
        category="Raylight",
        module=_RAY,
    ),
    "XFuserSamplerCustomAdvanced": _node(
        "XFuserSamplerCustomAdvanced",
        {
            "add_noise": ["BOOLEAN", {"default": True}],
            "noise_seed": ["INT", {"default": 0, "min": 0, "max": _U64, "control_after_generate": True}],
            "guider": ["GUIDER"],
            "sampler": ["SAMPLER"],
            "sigmas": ["SIGMAS"],
            "latent_image": ["LATENT"],
        },
        None,
        ("LATENT", "LATENT", "RAY_ACTORS"),
        ("output", "denoised_output", "ray_actors"),
        category="Raylight",
        module=_RAY,
    ),
}

STOCK_NODES["CLIPLoader"]["input"]["required"]["type"][0].append("minimax")

NODE_INFO: dict[str, dict[str, Any]] = {**STOCK_NODES, **EXTRA_NODES}

# (class, input) -> model folder; the options come from `FakeComfyUI.model_files`.
MODEL_INPUTS: dict[tuple[str, str], str] = {
    ("UNETLoader", "unet_name"): "diffusion_models",
    ("RayUNETLoader", "unet_name"): "diffusion_models",
    ("CLIPLoader", "clip_name"): "text_encoders",
    ("VAELoader", "vae_name"): "vae",
    ("CheckpointLoaderSimple", "ckpt_name"): "checkpoints",
}

# (class, input) -> (content types listed from input/, what its custom validation says when missing)
FILE_INPUTS: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("LoadImage", "image"): (("image",), "Invalid image file: {}"),
    ("LoadVideo", "file"): (("video",), "Invalid video file: {}"),
    ("LoadAudio", "audio"): (("audio", "video"), "Invalid audio file: {}"),
}


def node_info(class_type: str) -> dict[str, Any]:
    """A private copy of a class's static info (callers fill in the file lists)."""
    return copy.deepcopy(NODE_INFO[class_type])
