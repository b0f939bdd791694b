"""Speculative Jacobi Decoding with coupled draft re-sampling (SJD / SCD), batched.

One forward per iteration holds, per sample, the last committed token and J = L - 1 drafts; output
row i is the verified distribution p_i for new position n + i (n committed so far). Drafts are
verified by modified rejection sampling against the distribution q_i they were drawn from; the
first rejection is replaced by a residual draw, or all pass and row J gives a bonus token, so every
iteration commits accepted + 1 tokens. The KV of the committed window slots is kept (a per-row
length in a RaggedCache, so each sample advances by its own count) and the rest is scratch.

Drafts for the next iteration (positions beyond the commit) are re-sampled from this iteration's
rows: independently (SJD), by the MRS step itself (maximal coupling: Alg. 6), or by argmax(log p +
g) with g keyed on the absolute position (Gumbel coupling: Alg. 7). Positions no row reached start
as uniform random ids with a one-hot q, which MRS verifies exactly (accept with p(x), else draw
from p without x). Structural positions (end-of-line, end-of-image) are one-hot in p and q.

Every random draw is keyed on (seed, sample key, absolute position, iteration, stream), so a
sample's output does not depend on its batch (see noise.py).

Window "auto" (scd.window): the chooser's `begin` gives the request's window L (chosen for committed
tokens per second) and the request runs as a fixed window L does, J = L - 1 draft slots (draft slots
past the forward would cost every iteration's re-draft and never be verified). An iteration may
forward fewer slots S_t <= L (the rows still useful near the end, under any window; or the chooser's
`choose`, a scripted schedule in tests): a draft outside the forward stays as it is, with the q it was drawn from (still
a draft from q, so verifying it later is as exact as now); the one right after the forward's drafts
is verified by the forward's last row, which predicts its position. Re-drafting takes the forward's
rows where they reach, the kept drafts after them, fresh ids beyond. The window depends on measured
time and on the batch, so under "auto" a sample is still distributed exactly as the model's own
sampling but is no longer the same draw alone and batched.

Distributions live on the pool: the allowed ids plus the forced ones (all of V when nothing is
masked). The LM head is evaluated on those rows only and every per-id tensor is P wide, which for
a large text+image vocabulary (Emu3, Chameleon) is a fraction of V. Tokens are pool indices inside
the loop and real ids outside it.

Shapes: B samples, G rows (2B with CFG: conditional then unconditional), T prompt, S window slots
of this forward (L, or S_t <= L under "auto"), J = L - 1 draft slots (L: the request's under "auto"),
W = S - 1 drafts in this forward, P pool ids, N new tokens, K keys read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from spec_core.decoding.cache import RaggedCache
from spec_core.decoding.compiled import mark_dynamic, mark_keys, shared_step
from spec_core.decoding.tree import prefix_and_new_mask
from spec_core.decoding import noise
from spec_core.scd.adapters.base import ImageLayout, VisualLM
from spec_core.scd.config import ScdConfig
from spec_core.scd.coupling import gumbel_argmax, mrs, sample_inverse_cdf
from spec_core.sampling import entropy_nats, processed_probs
from spec_core.scd.window import WindowChooser


@dataclass
class ScdResult:
    """Per sample: new tokens (forced ones included), NFE (forwards incl. prefill, a CFG pair is
    one), committed tokens per iteration, mean entropy of the verified distributions at the free
    committed positions; and timings of the whole batch and its peak memory (CUDA: allocated;
    CPU: the decoding state - KV cache, drafts' distributions, Gumbel noise); the window L of each
    iteration of the batch (sample b took part in the first len(committed[b]) - 1)."""

    tokens_BN: torch.Tensor
    nfe_B: torch.Tensor
    committed: list[list[int]]
    entropy_B: torch.Tensor
    prefill_s: float = 0.0
    loop_s: float = 0.0
    peak_bytes: int = 0
    windows: list[int] = field(default_factory=list)

    def mean_window(self, b: int) -> float:
        """Mean L over the iterations sample b took part in (0.0 if none: done by the prefill)."""
        mine = self.windows[:len(self.committed[b]) - 1]
        return sum(mine) / len(mine) if mine else 0.0


class _State:
    """The active samples' decoding state (rows are dropped as samples finish): sample index,
    committed count n, cache length per row, tokens (pool indices), drafts and their recorded
    distributions q, and (Gumbel coupling) the noise of each draft position."""

    def __init__(self, idx_B, n_B, len_G, tokens_BN):
        self.idx_B, self.n_B, self.len_G, self.tokens_BN = idx_B, n_B, len_G, tokens_BN
        self.drafts_BJ = self.q_BJP = self.g_BJP = None

    def select(self, keep_B: torch.Tensor, rows_G: torch.Tensor) -> None:
        self.idx_B, self.n_B, self.len_G = self.idx_B[keep_B], self.n_B[keep_B], self.len_G[rows_G]
        self.tokens_BN, self.drafts_BJ, self.q_BJP = (self.tokens_BN[keep_B], self.drafts_BJ[keep_B],
                                                      self.q_BJP[keep_B])
        if self.g_BJP is not None:
            self.g_BJP = self.g_BJP[keep_B]


class JacobiDecoder:
    """Decode a batch of prompts into `layout.length` new tokens each with SJD / SCD.

    Under window "auto" the decoder owns a WindowChooser (or uses `chooser`, anything with its
    begin / choose / observe; `choose` never above what `begin` gave) that lives as long as the
    decoder: reuse one decoder (or chooser) across requests to keep its cost fit and acceptance
    counts."""

    def __init__(self, lm: VisualLM, layout: ImageLayout, cfg: ScdConfig, chooser: WindowChooser | None = None,
                 compile: bool = False):
        self.lm, self.layout, self.cfg = lm, layout, cfg
        self.compile = compile  # the window forward as a compiled step (decoding.compiled); outputs unchanged
        self.N, self.L = layout.length, cfg.slots
        self.J = self.L - 1
        if chooser is not None and (not cfg.auto or chooser.max_window != cfg.max_window):
            raise ValueError(f"a window chooser needs window 'auto' with its max_window {chooser.max_window}")
        self.chooser = chooser if chooser is not None else WindowChooser(cfg.max_window) if cfg.auto else None
        forced_N = layout.forced_N.long()
        if layout.allowed_V is None:  # the whole vocabulary: pool index = id
            self.pool_P, self.allowed_P, self.forced_N = None, None, forced_N
        else:
            allowed = layout.allowed_V.bool()
            ids = set(allowed.nonzero().squeeze(-1).tolist()) | set(forced_N[forced_N >= 0].tolist())
            self.pool_P = torch.tensor(sorted(ids), dtype=torch.long)
            lut = torch.full((max(len(allowed), int(self.pool_P.max()) + 1),), -1, dtype=torch.long)
            lut[self.pool_P] = torch.arange(len(self.pool_P))
            self.allowed_P = torch.zeros(len(self.pool_P), dtype=torch.bool)
            inside = self.pool_P < len(allowed)
            self.allowed_P[inside] = allowed[self.pool_P[inside]]
            self.forced_N = torch.where(forced_N >= 0, lut[forced_N.clamp_min(0)], -1)

    def _real(self, ids: torch.Tensor) -> torch.Tensor:
        """Pool indices -> vocabulary ids."""
        return ids if self.pool_P is None else self.pool_P.to(ids.device)[ids]

    # --- distributions and noise --------------------------------------------------------------
    def _probs(self, logits_GXP: torch.Tensor, pos_BX: torch.Tensor) -> torch.Tensor:
        """Pool logits of the G rows -> verified p (B, X, P) at new positions pos_BX."""
        B = pos_BX.shape[0]
        c = self.cfg
        allowed = None if self.allowed_P is None else self.allowed_P.to(self.device)
        p = processed_probs(logits_GXP[:B], logits_GXP[B:] if c.cfg else None, c.cfg_scale,
                            c.temperature, c.top_k, c.top_p, allowed)
        forced_BX = self._forced(pos_BX)
        hot = forced_BX >= 0
        if bool(hot.any()):
            one = torch.zeros_like(p).scatter_(-1, forced_BX.clamp_min(0)[..., None], 1.0)
            p = torch.where(hot[..., None], one, p)
        return p

    def _forced(self, pos_BX: torch.Tensor) -> torch.Tensor:
        """Forced pool index at each new position (-1: free; positions past the end are free)."""
        f = self.forced_N.to(pos_BX.device)
        inside = pos_BX < self.N
        return torch.where(inside, f[pos_BX.clamp(max=self.N - 1)], torch.full_like(pos_BX, -1))

    def _u(self, stream: int, pos_BX: torch.Tensor, it: int) -> torch.Tensor:
        return noise.uniform(self.seed, self.keys_B[self.st.idx_B][:, None], pos_BX, it, stream)

    def _gumbel(self, pos_BX: torch.Tensor) -> torch.Tensor:
        """Gumbel noise (B, X, P) per (sample, absolute position, vocabulary id): the same on
        every iteration, computed once per position (the state keeps it while it is a draft)."""
        h_BX = noise.hash_keys(self.seed, self.keys_B[self.st.idx_B][:, None], pos_BX, noise.GUMBEL)
        ids_P = self._real(torch.arange(self.P, device=pos_BX.device))
        return noise.gumbel(h_BX[..., None], ids_P)

    def _fresh(self, pos_BX: torch.Tensor, it: int) -> torch.Tensor:
        """Uniform random allowed ids (forced ids where forced) for never-drafted positions."""
        dev = pos_BX.device
        pool_A = (torch.arange(self.P, device=dev) if self.allowed_P is None
                  else self.allowed_P.to(dev).nonzero().squeeze(-1))
        u = self._u(noise.FRESH, pos_BX, it)
        ids = pool_A[(u * len(pool_A)).long().clamp(max=len(pool_A) - 1)]
        forced = self._forced(pos_BX)
        return torch.where(forced >= 0, forced, ids)

    # --- forwards --------------------------------------------------------------------------
    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """Per-sample tensor -> per-row (CFG rows repeat the samples)."""
        return torch.cat([x, x]) if self.cfg.cfg else x

    def _logits(self, embeds, pos, attend) -> torch.Tensor:
        return self.lm.logits(embeds, pos, attend, self.cache, vocab_P=self.pool, head=self.head)

    @torch.no_grad()
    def _prefill(self, prompts_G: list[list[int]]) -> torch.Tensor:
        """All prompts in one forward, row g at slots [0, T_g); -> last-position logits (G, P)."""
        dev = self.device
        T_G = torch.tensor([len(p) for p in prompts_G], device=dev)
        T = int(T_G.max())
        ids_GT = torch.zeros(len(prompts_G), T, dtype=torch.long, device=dev)
        pos_GT = torch.arange(T, device=dev).expand(len(prompts_G), T)
        # one tensor for all rows (not one per row: batches of thousands of samples): row-major
        # order of the real slots is the prompts' concatenation
        ids_GT[pos_GT < T_G[:, None]] = torch.tensor([t for p in prompts_G for t in p], dtype=torch.long, device=dev)
        # causal, and only real prompt keys (padding queries past T_g are scratch)
        attend_GTT = torch.ones(T, T, dtype=torch.bool, device=dev).tril()[None] & (pos_GT < T_G[:, None])[:, None, :]
        self.cache.plan(pos_GT, T)
        logits = self._logits(self.lm.embed_prompt(ids_GT), pos_GT, attend_GTT)
        return logits[torch.arange(len(prompts_G), device=dev), T_G - 1]

    @torch.no_grad()
    def _window(self, S: int) -> torch.Tensor:
        """Forward [last committed, first S - 1 drafts] of every active sample -> logits (G, S, P)."""
        st, dev = self.st, self.device
        B = len(st.idx_B)
        last_B = st.tokens_BN[torch.arange(B, device=dev), st.n_B - 1]
        ids_GS = self._real(self._rows(torch.cat([last_B[:, None], st.drafts_BJ[:, :S - 1]], 1)))
        K = int(st.len_G.max()) + S
        self.cache.reserve(K)
        G = len(st.len_G)
        return self.window_step(("window", min(G, 2), min(S, 2)), self.lm, self.cache, mark_dynamic(ids_GS, 0, 1),
                                mark_dynamic(st.len_G, 0), mark_keys(torch.arange(K, device=dev)), self.pool, self.head)

    # --- the loop ------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, prompts: list[list[int]], uncond_prompts: list[list[int]] | None = None,
            seed: int = 0, sample_keys: list[int] | None = None) -> ScdResult:
        """Decode every prompt (one sample each); `sample_keys` name the samples' noise streams
        (default 0..B-1); with CFG, `uncond_prompts` are the unconditional prefixes."""
        cfg, N, J = self.cfg, self.N, self.J
        B = len(prompts)
        if cfg.cfg and (uncond_prompts is None or len(uncond_prompts) != B):
            raise ValueError("cfg_scale != 1 needs one unconditional prompt per prompt")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        self.device = dev = self.lm.device
        self.seed = seed
        if self.chooser is not None:  # one window for this batch's requests (window.py: why)
            self.L = self.chooser.begin(len(prompts) * (2 if cfg.cfg else 1))
            self.J = J = self.L - 1
        self.keys_B = torch.tensor(sample_keys if sample_keys is not None else range(B), device=dev)
        rows = prompts + (uncond_prompts if cfg.cfg else [])
        T_G = torch.tensor([len(r) for r in rows], device=dev)
        self.cache = RaggedCache(len(rows), int(T_G.max()) + N + self.L + 1, self.lm.num_layers, static=self.compile)
        self.pool = None if self.pool_P is None else self.pool_P.to(dev)
        self.head = self.lm.head_rows(self.pool)  # once per run (an argument of the compiled window)
        # kept on the HF model: `generate` wraps it in a new adapter per call, and the calls share the graphs
        self.window_step = shared_step(getattr(self.lm, "model", self.lm), window_logits, self.compile, dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()

        self.st = st = _State(torch.arange(B, device=dev), torch.ones(B, dtype=torch.long, device=dev),
                              T_G.clone(), torch.zeros(B, N + self.L, dtype=torch.long, device=dev))
        pos0_B1 = torch.zeros(B, 1, dtype=torch.long, device=dev)
        p0_BP = self._probs(self._prefill(rows)[:, None], pos0_B1)[:, 0]
        self._rows_dynamic()
        self.P = p0_BP.shape[-1]
        st.tokens_BN[:, 0] = sample_inverse_cdf(p0_BP, self._u(noise.RESIDUAL, pos0_B1, 0)[:, 0])
        free0 = self._forced(pos0_B1)[:, 0] < 0
        ent_sum_B, ent_cnt_B = torch.where(free0, entropy_nats(p0_BP), 0.0), free0.long()
        nfe_B = torch.ones(B, dtype=torch.long)
        committed: list[list[int]] = [[1] for _ in range(B)]
        out_BN = torch.zeros(B, N, dtype=torch.long)
        out_ent, out_cnt = torch.zeros(B), torch.zeros(B, dtype=torch.long)
        pos_BJ = 1 + torch.arange(J, device=dev).expand(B, J)
        st.drafts_BJ = self._fresh(pos_BJ, 0)
        st.q_BJP = torch.zeros(B, J, self.P, device=dev).scatter_(-1, st.drafts_BJ[..., None], 1.0)
        if cfg.coupling == "gs":
            st.g_BJP = self._gumbel(pos_BJ)
        state_bytes = self.cache.nbytes() + sum(t.numel() * t.element_size() for t in
                                                (st.q_BJP, st.g_BJP, st.tokens_BN) if t is not None)
        prefill_s = time.perf_counter() - t0
        it, windows = 0, []
        while True:
            done = (st.n_B >= N).nonzero().squeeze(-1)
            if len(done):  # retire finished samples (all at once: batches of thousands)
                i_D = st.idx_B[done].cpu()
                out_BN[i_D] = self._real(st.tokens_BN[done, :N]).cpu()
                out_ent[i_D], out_cnt[i_D] = ent_sum_B[done].cpu().to(out_ent.dtype), ent_cnt_B[done].cpu()
                keep = (st.n_B < N).nonzero().squeeze(-1)
                if len(keep) == 0:
                    break
                rows_G = torch.cat([keep, keep + len(st.idx_B)]) if cfg.cfg else keep
                self.cache.select_rows(rows_G)
                self._rows_dynamic()
                st.select(keep, rows_G)
                ent_sum_B, ent_cnt_B = ent_sum_B[keep], ent_cnt_B[keep]
            it += 1
            nfe_B[st.idx_B.cpu()] += 1
            if self.chooser is None:  # rows past every sample's last position would be scratch
                S = min(self.L, int(N - st.n_B.min()))
                k_B, ent_B, cnt_B, _ = self._iterate(it, S)
            elif getattr(self.chooser, "locked", None) is not None:  # nothing to time: as fixed
                S = self.chooser.choose(len(st.len_G), cap=int(N - st.n_B.min()))
                k_B, ent_B, cnt_B, _ = self._iterate(it, S)
            else:  # timed: the whole iteration (forward, verification, re-draft) at this window
                left_B = (N - st.n_B).cpu()
                S = self.chooser.choose(len(st.len_G), cap=int(left_B.max()))
                t_it = self._clock()
                k_B, ent_B, cnt_B, lead_B = self._iterate(it, S)
                self.chooser.observe(S, len(st.len_G), self._clock() - t_it, lead_B, left_B)
            windows.append(S)
            ent_sum_B, ent_cnt_B = ent_sum_B + ent_B, ent_cnt_B + cnt_B
            for b, k in zip(st.idx_B.tolist(), k_B.tolist()):
                committed[b].append(k)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        loop_s = time.perf_counter() - t0 - prefill_s
        peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else state_bytes
        return ScdResult(out_BN, nfe_B, committed, out_ent / out_cnt.clamp_min(1), prefill_s, loop_s,
                         int(peak), windows)

    def _rows_dynamic(self) -> None:
        """Rows retire as samples finish, and a run's cache holds its longest prompt: the cache's
        rows and slots are dynamic dimensions of the compiled window (one graph for every count)."""
        for layer in self.cache.layers:
            mark_dynamic(layer.keys, 0, 2)
            mark_dynamic(layer.values, 0, 2)

    def _clock(self) -> float:
        if self.device.type == "cuda":  # queued kernels belong to the interval being timed
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _iterate(self, it: int, S: int) -> tuple[torch.Tensor, ...]:
        """One forward of S slots, verification, commit and re-draft. Returns per active sample:
        committed count, summed entropy and count of the free committed positions, and the
        leading accepted drafts of the forward."""
        st, dev, J = self.st, self.device, self.J
        W = S - 1
        logits_GSP = self._window(S)
        pos_BS = st.n_B[:, None] + torch.arange(S, device=dev)  # new position each row predicts
        p_BSP = self._probs(logits_GSP, pos_BS)
        u_acc, u_res = self._u(noise.ACCEPT, pos_BS, it), self._u(noise.RESIDUAL, pos_BS, it)
        # MRS at every row with a draft (verification, and the maximal coupling of the re-draft):
        # the forward's W drafts and, below the largest window, the kept draft at the last row's
        # position. Else the last row has no draft: a plain draw from it (the bonus token, or a draft)
        R = min(S, J)
        y = mrs(p_BSP[:, :R], st.q_BJP[:, :R], st.drafts_BJ[:, :R], u_acc[:, :R], u_res[:, :R])
        y_BS = y.ids_R
        if R < S:
            y_BS = torch.cat([y_BS, sample_inverse_cdf(p_BSP[:, W], u_res[:, W])[:, None]], 1)
        lead_B = y.accepted_R[:, :W].long().cumprod(1).sum(1)  # leading accepts (W if all)
        k_B = torch.minimum(lead_B + 1, self.N - st.n_B)  # accepted + 1, never past the end

        # commit: rows [0, k) of y are the new tokens; the KV of window slots [0, k) is now valid.
        # Rows past k are written too, as scratch: a later commit overwrites them before n passes.
        st.tokens_BN.scatter_(1, st.n_B[:, None] + torch.arange(S, device=dev), y_BS)
        kmax = int(k_B.max())
        free_BK = (torch.arange(kmax, device=dev) < k_B[:, None]) & (self._forced(pos_BS[:, :kmax]) < 0)
        ent_B = (entropy_nats(p_BSP[:, :kmax]) * free_BK).sum(1)
        st.n_B = st.n_B + k_B
        st.len_G = st.len_G + self._rows(k_B)
        self._redraft(it, S, k_B, p_BSP, y_BS)
        return k_B.cpu(), ent_B.cpu(), free_BK.sum(1).cpu(), lead_B.cpu()

    def _redraft(self, it: int, S: int, k_B: torch.Tensor, p_BSP: torch.Tensor, y_BS: torch.Tensor) -> None:
        """Drafts for positions n' + j (n' = n + k, j < J): old row i = k + j where the forward had
        it (i < S; only slots j < W can be such), else the kept old draft slot i with its q and
        noise (i < J; a window below the largest), else a fresh id."""
        st, dev, cfg, J, P = self.st, self.device, self.cfg, self.J, self.P
        B, W = k_B.shape[0], S - 1
        i_BJ = k_B[:, None] + torch.arange(J, device=dev)
        has_BW = i_BJ[:, :W] < S
        gi_BW = i_BJ[:, :W].clamp(max=S - 1)
        p_new_BWP = p_BSP.gather(1, gi_BW[..., None].expand(B, W, P))
        pos_new_BJ = st.n_B[:, None] + torch.arange(J, device=dev)
        pos_BW = pos_new_BJ[:, :W]
        indep_BW = sample_inverse_cdf(p_new_BWP, self._u(noise.DRAFT, pos_BW, it))
        if cfg.coupling == "mc":
            coupled_BW = y_BS.gather(1, gi_BW)
        elif cfg.coupling == "gs":
            self._shift_gumbel(k_B, pos_new_BJ)  # kept drafts keep their noise too
            coupled_BW = gumbel_argmax(p_new_BWP, st.g_BJP[:, :W])
        else:
            coupled_BW = indep_BW
        if cfg.coupling != "none" and cfg.alpha < 1.0:
            coin_BW = self._u(noise.COIN, pos_BW, it) < cfg.alpha
            coupled_BW = torch.where(coin_BW, coupled_BW, indep_BW)
        drafts_BJ = self._fresh(pos_new_BJ, it)
        q_BJP = torch.zeros_like(st.q_BJP).scatter_(-1, drafts_BJ[..., None], 1.0)
        if S <= J:  # a window below the largest: the drafts it did not reach stay, with their q
            kept_BJ = (i_BJ >= S) & (i_BJ < J)
            src_BJ = i_BJ.clamp(max=J - 1)
            drafts_BJ = torch.where(kept_BJ, st.drafts_BJ.gather(1, src_BJ), drafts_BJ)
            q_BJP = torch.where(kept_BJ[..., None], st.q_BJP.gather(1, src_BJ[..., None].expand(B, J, P)), q_BJP)
        st.drafts_BJ = torch.cat([torch.where(has_BW, coupled_BW, drafts_BJ[:, :W]), drafts_BJ[:, W:]], 1)
        st.q_BJP = torch.cat([torch.where(has_BW[..., None], p_new_BWP, q_BJP[:, :W]), q_BJP[:, W:]], 1)

    def _shift_gumbel(self, k_B: torch.Tensor, pos_new_BJ: torch.Tensor) -> None:
        """Draft slot j now holds position n' + j = (old slot j + k): move the kept noise down,
        hash only the positions that entered the draft range."""
        st, J = self.st, self.J
        B, P = k_B.shape[0], self.P
        src_BJ = k_B[:, None] + torch.arange(J, device=k_B.device)
        shifted = st.g_BJP.gather(1, src_BJ.clamp(max=J - 1)[..., None].expand(B, J, P))
        m = min(int(k_B.max()), J)
        start = J - m  # every slot below start is kept by every row (j + k < J)
        fresh = self._gumbel(pos_new_BJ[:, start:])
        keep = (src_BJ[:, start:] < J)[..., None]
        st.g_BJP = torch.cat([shifted[:, :start], torch.where(keep, shifted[:, start:], fresh)], 1)


def window_logits(lm: VisualLM, cache: RaggedCache, ids_GS: torch.Tensor, len_G: torch.Tensor, keys_K: torch.Tensor,
                  vocab_P: torch.Tensor | None, head) -> torch.Tensor:
    """The window forward as one fixed-shape function (a compiled step): row g's S sampled ids at
    cache slots (= positions: every prompt starts at slot 0, nothing is padded) len_G[g] + s,
    causal among themselves after the row's committed keys -> logits (G, S, P)."""
    G, S = ids_GS.shape
    K = keys_K.shape[0]
    slots_GS = len_G[:, None] + torch.arange(S, device=ids_GS.device)
    causal_GSS = torch.ones(S, S, dtype=torch.bool, device=ids_GS.device).tril().expand(G, S, S)
    cache.plan_step(slots_GS, K)
    logits_GSP = lm.logits(lm.embed_sampled(ids_GS), slots_GS, prefix_and_new_mask(len_G, causal_GSS, K), cache,
                           vocab_P=vocab_P, head=head)
    cache.end_step()
    return logits_GSP
