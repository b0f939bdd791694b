"""Patch codec: shapes, exact round trip on codeword images, save/load, k-means determinism."""

from __future__ import annotations

import numpy as np
import torch

from spec_core.reference.generator.codec import (PatchCodec, fit_codec, patchify, pil_to_tensor,
                                                 psnr, tensor_to_pil, unpatchify)
from spec_core.reference.generator.data import SceneSpec, image_example

torch.set_num_threads(1)


def _images(n: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return pil_to_tensor([image_example(rng, SceneSpec(texture=0.6))[1] for _ in range(n)])


def _codec(k: int = 64) -> PatchCodec:
    return fit_codec(_images(6), k, 2, iters=3, max_patches=2048,
                     generator=torch.Generator().manual_seed(0))


def test_patchify_round_trip():
    x_BCHW = torch.rand(2, 3, 8, 6)
    p_BTD = patchify(x_BCHW, 2)
    assert p_BTD.shape == (2, 12, 12)
    assert torch.equal(unpatchify(p_BTD, (4, 3), 2), x_BCHW)
    # row-major patches, channel-major inside a patch
    assert torch.equal(p_BTD[0, 1, :4], x_BCHW[0, 0, 0:2, 2:4].reshape(-1))


def test_encode_decode_shapes_and_exact_codeword_images():
    codec = _codec()
    x_BCHW = _images(3, seed=1)
    ids_BT = codec.encode(x_BCHW)
    assert ids_BT.shape == (3, 256) and ids_BT.dtype == torch.long
    assert int(ids_BT.min()) >= 0 and int(ids_BT.max()) < 64
    y_BCHW = codec.decode(ids_BT, (16, 16))
    assert y_BCHW.shape == (3, 3, 32, 32)
    # an image made of codewords is reproduced exactly
    assert torch.equal(codec.decode(codec.encode(y_BCHW), (16, 16)), y_BCHW)
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(0))
    assert torch.equal(codec.encode(codec.decode(ids, (4, 5))), ids)
    assert 15.0 < psnr(codec, x_BCHW) < 60.0


def test_pil_helpers_round_trip():
    codec = _codec()
    ids = torch.randint(0, 64, (2, 64), generator=torch.Generator().manual_seed(1))
    ims = codec.decode_pil(ids, (8, 8))
    assert [im.size for im in ims] == [(16, 16), (16, 16)]
    x = pil_to_tensor(ims)
    assert torch.equal(pil_to_tensor(tensor_to_pil(x)), x)


def test_save_load_identical(tmp_path):
    codec = _codec()
    codec.save_pretrained(tmp_path)
    assert (tmp_path / "codec_config.json").is_file()
    assert (tmp_path / "codec.safetensors").is_file()
    loaded = PatchCodec.from_pretrained(tmp_path)
    x = _images(2, seed=3)
    assert torch.equal(loaded.codebook_KD, codec.codebook_KD)
    assert torch.equal(loaded.encode(x), codec.encode(x))
    assert loaded.patch == 2 and loaded.codebook_size == 64


def test_fit_is_deterministic_for_a_seed():
    assert torch.equal(_codec().codebook_KD, _codec().codebook_KD)


def test_fit_pools_images_of_different_sizes():
    x32 = _images(2)
    x16 = torch.nn.functional.avg_pool2d(x32, 2)
    codec = fit_codec([x32, x16], 32, 2, iters=2, generator=torch.Generator().manual_seed(0))
    assert codec.codebook_KD.shape == (32, 12)
