"""VQ patch codec: a k-means codebook over p x p RGB patches; image <-> grid of code ids."""

# Shape legend: B batch, C channels (3), H/W pixels, T tokens (patches, row-major), D = C*p*p
# patch dim, K codebook size, N patches pooled over a batch.

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file, save_file
from torch import nn

CODEC_CONFIG = "codec_config.json"
CODEC_WEIGHTS = "codec.safetensors"


def pil_to_tensor(images: list[Image.Image]) -> torch.Tensor:
    """PIL RGB images (same size) -> float images_BCHW in [0, 1]."""
    arr_BHWC = np.stack([np.asarray(im.convert("RGB"), dtype=np.float32) for im in images])
    return torch.from_numpy(arr_BHWC).permute(0, 3, 1, 2).contiguous() / 255.0


def tensor_to_pil(images_BCHW: torch.Tensor) -> list[Image.Image]:
    """Float images_BCHW in [0, 1] -> PIL RGB images (rounded to uint8)."""
    arr_BHWC = (images_BCHW.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
    return [Image.fromarray(a.numpy(), "RGB") for a in arr_BHWC]


def patchify(images_BCHW: torch.Tensor, patch: int) -> torch.Tensor:
    """images_BCHW -> patches_BTD (row-major patch order, D ordered channel, row, column)."""
    _, _, h, w = images_BCHW.shape
    if h % patch or w % patch:
        raise ValueError(f"Image size {h}x{w} is not a multiple of the patch size {patch}.")
    return F.unfold(images_BCHW, kernel_size=patch, stride=patch).transpose(1, 2)


def unpatchify(patches_BTD: torch.Tensor, grid_hw: tuple[int, int], patch: int) -> torch.Tensor:
    """Inverse of `patchify`: patches_BTD -> images_BCHW."""
    gh, gw = grid_hw
    if patches_BTD.shape[1] != gh * gw:
        raise ValueError(f"{patches_BTD.shape[1]} tokens do not fill a {gh}x{gw} grid.")
    return F.fold(patches_BTD.transpose(1, 2), (gh * patch, gw * patch), kernel_size=patch,
                  stride=patch)


def nearest_code(x_ND: torch.Tensor, codebook_KD: torch.Tensor) -> torch.Tensor:
    """Index of the nearest codeword (squared L2) for each row, ids_N."""
    out_N = torch.empty(x_ND.shape[0], dtype=torch.long)
    c2_K = (codebook_KD * codebook_KD).sum(1)
    for s in range(0, x_ND.shape[0], 16384):  # chunked: the N x K distance matrix stays small
        x = x_ND[s:s + 16384]
        d_NK = c2_K[None, :] - 2.0 * x @ codebook_KD.T
        out_N[s:s + 16384] = d_NK.argmin(1)
    return out_N


class PatchCodec(nn.Module):
    """Patch codebook: encode = nearest codeword per p x p patch, decode = codeword lookup."""

    def __init__(self, codebook_KD: torch.Tensor, patch: int = 2) -> None:
        super().__init__()
        if codebook_KD.ndim != 2 or codebook_KD.shape[1] != 3 * patch * patch:
            raise ValueError(f"Codebook must be (K, {3 * patch * patch}), got "
                             f"{tuple(codebook_KD.shape)}.")
        self.patch = patch
        self.register_buffer("codebook_KD", codebook_KD.detach().float().clone())

    @property
    def codebook_size(self) -> int:
        """Number of codewords K."""
        return int(self.codebook_KD.shape[0])

    def grid_hw(self, height: int, width: int) -> tuple[int, int]:
        """Token grid of an image of the given pixel size."""
        return height // self.patch, width // self.patch

    @torch.no_grad()
    def encode(self, images_BCHW: torch.Tensor) -> torch.Tensor:
        """Float images in [0, 1] -> ids_BT (row-major nearest codewords)."""
        patches_BTD = patchify(images_BCHW.float(), self.patch)
        b, t, d = patches_BTD.shape
        return nearest_code(patches_BTD.reshape(b * t, d), self.codebook_KD).view(b, t)

    @torch.no_grad()
    def decode(self, ids_BT: torch.Tensor, grid_hw: tuple[int, int]) -> torch.Tensor:
        """ids_BT -> images_BCHW in [0, 1] of size (grid_h * p, grid_w * p)."""
        if ids_BT.numel() and (int(ids_BT.min()) < 0 or int(ids_BT.max()) >= self.codebook_size):
            raise ValueError(f"Code ids must lie in [0, {self.codebook_size}).")
        patches_BTD = self.codebook_KD[ids_BT.long()]
        return unpatchify(patches_BTD, grid_hw, self.patch).clamp(0, 1)

    def encode_pil(self, images: list[Image.Image]) -> torch.Tensor:
        """PIL images -> ids_BT."""
        return self.encode(pil_to_tensor(images))

    def decode_pil(self, ids_BT: torch.Tensor, grid_hw: tuple[int, int]) -> list[Image.Image]:
        """ids_BT -> PIL images."""
        return tensor_to_pil(self.decode(ids_BT, grid_hw))

    def save_pretrained(self, directory: str | Path) -> None:
        """Write codec.safetensors + codec_config.json into `directory`."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        save_file({"codebook": self.codebook_KD.contiguous()}, str(d / CODEC_WEIGHTS))
        cfg = {"patch": self.patch, "codebook_size": self.codebook_size, "channels": 3,
               "codebook_dim": int(self.codebook_KD.shape[1])}
        (d / CODEC_CONFIG).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> PatchCodec:
        """Load a codec saved by `save_pretrained` from a local directory."""
        d = Path(directory)
        cfg = json.loads((d / CODEC_CONFIG).read_text())
        codebook_KD = load_file(str(d / CODEC_WEIGHTS))["codebook"]
        if codebook_KD.shape[0] != cfg["codebook_size"]:
            raise ValueError(f"{d}: codebook has {codebook_KD.shape[0]} rows, config says "
                             f"{cfg['codebook_size']}.")
        return cls(codebook_KD, patch=int(cfg["patch"]))


def _kmeans_pp_init(x_ND: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """k-means++ seeding (D^2 sampling) -> centres_KD."""
    n = x_ND.shape[0]
    first = int(torch.randint(n, (1,), generator=generator))
    centres = [x_ND[first]]
    d2_N = ((x_ND - x_ND[first]) ** 2).sum(1)
    for _ in range(1, k):
        total = float(d2_N.sum())
        if total <= 0:  # fewer distinct points than k: pick uniformly
            idx = int(torch.randint(n, (1,), generator=generator))
        else:
            idx = int(torch.multinomial(d2_N / total, 1, generator=generator))
        centres.append(x_ND[idx])
        d2_N = torch.minimum(d2_N, ((x_ND - x_ND[idx]) ** 2).sum(1))
    return torch.stack(centres)


def kmeans(x_ND: torch.Tensor, k: int, iters: int, generator: torch.Generator) -> torch.Tensor:
    """Seeded k-means (k-means++ init, `iters` Lloyd steps; empty clusters re-seeded) -> KD."""
    if x_ND.shape[0] < k:
        raise ValueError(f"k-means needs at least k={k} points, got {x_ND.shape[0]}.")
    centres_KD = _kmeans_pp_init(x_ND, k, generator)
    for _ in range(iters):
        assign_N = nearest_code(x_ND, centres_KD)
        sums_KD = torch.zeros_like(centres_KD).index_add_(0, assign_N, x_ND)
        counts_K = torch.bincount(assign_N, minlength=k).to(x_ND.dtype)
        empty = counts_K == 0
        means_KD = sums_KD / counts_K.clamp(min=1)[:, None]
        centres_KD = torch.where(empty[:, None], centres_KD, means_KD)
        n_empty = int(empty.sum())
        if n_empty:
            pick = torch.randint(x_ND.shape[0], (n_empty,), generator=generator)
            centres_KD[empty] = x_ND[pick]
    return centres_KD


def fit_codec(images: torch.Tensor | list[torch.Tensor], codebook_size: int = 512, patch: int = 2,
              iters: int = 10, max_patches: int = 65536,
              generator: torch.Generator | None = None) -> PatchCodec:
    """Fit a PatchCodec by k-means over a seeded subsample of the patches of images_BCHW (one
    tensor, or a list of tensors of different pixel sizes whose patches are pooled)."""
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    batches = [images] if isinstance(images, torch.Tensor) else list(images)
    x_ND = torch.cat([patchify(b.float(), patch).reshape(-1, 3 * patch * patch) for b in batches])
    if x_ND.shape[0] > max_patches:
        x_ND = x_ND[torch.randperm(x_ND.shape[0], generator=g)[:max_patches]]
    return PatchCodec(kmeans(x_ND, codebook_size, iters, g), patch=patch)


def psnr(codec: PatchCodec, images_BCHW: torch.Tensor) -> float:
    """Reconstruction PSNR (dB, peak 1.0) of encode -> decode over a batch."""
    ids_BT = codec.encode(images_BCHW)
    recon_BCHW = codec.decode(ids_BT, codec.grid_hw(*images_BCHW.shape[-2:]))
    mse = float(((recon_BCHW - images_BCHW.float()) ** 2).mean())
    return float("inf") if mse == 0 else 10.0 * math.log10(1.0 / mse)
