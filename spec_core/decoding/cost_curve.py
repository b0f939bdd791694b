"""A verification forward's seconds as a monotone curve in the tokens it verifies, kept per
token-count band so that what a rare large tree measured is not forgotten under the many small
steps a policy then chooses.

Why not one line: on a CPU a forward's cost is concave in its tokens at few tokens (measured on 2
cores at batch 2: ~0.2 ms per token up to 18 tokens, ~0.1 beyond), and a line fitted with
exponential forgetting over the steps a policy takes lies on the small trees it has been choosing:
its slope overstates what a larger tree adds, and the policy keeps choosing small trees (goodput
verified 5-6 nodes per slot at batch 2 where fixed 8-12-node trees were faster). Here each band of
token counts (half an octave: 1, 2, 3, 4-5, 6-7, 8-11, ...) keeps its own running mean of
(tokens, seconds), refreshed only by the steps that land in it - the policy's periodic
explorations keep the large bands current - and the curve is the piecewise-linear interpolation of
the bands' means, made non-decreasing (pool-adjacent-violators, weighted by observations), with
the caller's line slope beyond the observed bands. The bands hold the curve's shape; its level is
one scale factor that every step updates (measured / predicted), so a machine that slows down or
speeds up moves the rare bands with the visited ones.

Measured (2026-12-03, 2 cores, `scripts/bench_batch.py --band-curve`, EAGLE-2-style at batch 1-8,
median of 5 interleaved runs), the curve without the scale: the goodput policy verified more nodes
(8.3 / 8.1 per step at batch 1 / 2 against the line's 5.8 / 7.0) and ran 0.90 / 0.93 / 0.99 /
0.96x as fast as with the line at batch 1 / 2 / 4 / 8; so `GoodputPolicy(band_curve=False)` is the
default. The likely reason, which the scale addresses: the machine's speed drifted within the run
(verification 3x slower than on earlier days), and a band measured only by the rare explorations
kept an older, faster figure while the small bands followed: large trees looked cheap.

Shapes: K observed bands.
"""

from __future__ import annotations

import math

import torch


class BandCurve:
    """seconds(tokens) = scale x shape(tokens). The shape: per half-octave band a running mean of
    (tokens, seconds / scale) - the plain mean of the first 1 / alpha observations, then an
    exponential moving average with `alpha`. The scale: one exponential moving average (`scale_alpha`)
    of measured / predicted seconds over every step that lands in a band already measured, so a
    change of the machine's speed, seen in the bands a policy visits, moves the whole curve at once,
    while a rarely visited band keeps its place relative to the others (without the scale it kept
    an older figure: measured 0.90-0.99x the line's throughput). `scale_alpha=0`: no scale."""

    def __init__(self, alpha: float = 0.05, scale_alpha: float = 0.2):
        self.alpha, self.scale_alpha = alpha, scale_alpha
        self.scale = 1.0
        self._bands: dict[int, list[float]] = {}   # band -> [observations, mean tokens, mean seconds / scale]
        self._points: tuple[torch.Tensor, torch.Tensor] | None = None  # (x_K, shape y_K), monotone; None: stale

    @staticmethod
    def band(tokens: float) -> int:
        return int(math.floor(2 * math.log2(max(tokens, 1.0)) + 1e-9))

    def observe(self, tokens: float, seconds: float) -> None:
        key = self.band(tokens)
        if self.scale_alpha > 0 and key in self._bands and self.bands >= 2:
            predicted = float(self._shape(torch.as_tensor(float(tokens), dtype=torch.float64), 0.0))
            if predicted > 0:
                self.scale += self.scale_alpha * (seconds / predicted - self.scale)
        n_x_y = self._bands.setdefault(key, [0.0, 0.0, 0.0])
        n_x_y[0] += 1
        w = max(1.0 / n_x_y[0], self.alpha)
        n_x_y[1] += w * (tokens - n_x_y[1])
        n_x_y[2] += w * (seconds / self.scale - n_x_y[2])
        self._points = None

    @property
    def bands(self) -> int:
        return len(self._bands)

    def points(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(x_K, y_K): the bands' mean tokens ascending and their seconds (scaled) made non-decreasing."""
        x_K, shape_K = self._shape_points()
        return x_K, self.scale * shape_K

    def _shape_points(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._points is None:
            rows = sorted(self._bands.values(), key=lambda r: r[1])
            self._points = (torch.tensor([r[1] for r in rows], dtype=torch.float64),
                            torch.tensor(_isotonic([r[2] for r in rows], [min(r[0], 1 / self.alpha) for r in rows]),
                                         dtype=torch.float64))
        return self._points

    def _shape(self, t: torch.Tensor, slope: float) -> torch.Tensor:
        """The shape at t: interpolated between the bands, extended at `slope` (shape units) beyond."""
        x_K, y_K = self._shape_points()
        i = torch.searchsorted(x_K, t).clamp(1, len(x_K) - 1) if len(x_K) > 1 else torch.zeros_like(t, dtype=torch.long)
        lo, hi = (i - 1).clamp(min=0), i
        span = x_K[hi] - x_K[lo]
        inner = y_K[lo] + (y_K[hi] - y_K[lo]) * (t - x_K[lo]) / torch.where(span > 0, span, 1.0)
        below = y_K[0] + slope * (t - x_K[0])
        above = y_K[-1] + slope * (t - x_K[-1])
        return torch.where(t < x_K[0], below, torch.where(t > x_K[-1], above, inner)).clamp(min=0.0)

    def at(self, tokens: float | torch.Tensor, slope: float) -> float | torch.Tensor:
        """Seconds at `tokens` (a number or a tensor of them): interpolated between the bands,
        extended at `slope` seconds per token beyond them (never below 0)."""
        t = torch.as_tensor(tokens, dtype=torch.float64)
        out = self.scale * self._shape(t, slope / self.scale)
        return float(out) if out.dim() == 0 and not isinstance(tokens, torch.Tensor) else out


def _isotonic(y: list[float], w: list[float]) -> list[float]:
    """The non-decreasing sequence closest to y in weighted least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for yi, wi in zip(y, w):
        blocks.append([yi, wi, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return [m for m, _, c in blocks for _ in range(int(c))]
