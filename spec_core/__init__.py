"""spec_core: lossless speculative decoding for vision-language and visual-generation models."""
