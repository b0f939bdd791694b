"""The tiny autoregressive visual generator of the reference world (SCD's test bed): a k-means
patch codec, one word + image-code vocabulary, Llama image/video LMs, a cached CFG sampler."""

from spec_core.reference.generator.build import (GeneratorBuildConfig, build_generator,
                                                 evaluate_generator)
from spec_core.reference.generator.bundle import GeneratorBundle, SamplingConfig, load_generator
from spec_core.reference.generator.codec import PatchCodec, fit_codec, pil_to_tensor, tensor_to_pil
from spec_core.reference.generator.data import SceneSpec, image_prompt
from spec_core.reference.generator.layout import (MAX_ROWS, SAMPLE, GeneratorLayout,
                                                  build_tokenizer, code_positions, encode_prompt,
                                                  image_prefix, image_template, video_prefix,
                                                  video_template)
from spec_core.reference.generator.sample import (generate_images, generate_video,
                                                  prefix_rows,
                                                  processed_probs, sample_codes)
from spec_core.reference.generator.train import LMSpec

__all__ = [
    "GeneratorBuildConfig", "GeneratorBundle", "GeneratorLayout", "LMSpec", "MAX_ROWS",
    "PatchCodec", "SAMPLE", "SamplingConfig", "SceneSpec", "build_generator", "build_tokenizer",
    "code_positions", "encode_prompt", "evaluate_generator", "fit_codec", "generate_images",
    "generate_video", "image_prefix", "image_prompt", "image_template",
    "load_generator", "pil_to_tensor", "prefix_rows", "processed_probs",
    "sample_codes", "tensor_to_pil",
    "video_prefix", "video_template",
]
