"""Training-free drafters over one sample's token history (MMSpec's PLD, SAM, Lookahead, Recycling)
and the glue from their candidate paths to a batched `DraftTree`."""

from spec_core.decoding.proposers.paths import Proposer, paths_to_tree, propose_batch, trees_to_batch
from spec_core.decoding.proposers.pld import PromptLookup
from spec_core.decoding.proposers.recycling import RECYCLING_TEMPLATE, TokenRecycling
from spec_core.decoding.proposers.suffix_automaton import StaticCorpus, SuffixAutomaton
from spec_core.decoding.proposers.trie import LookaheadTrie

# MMSpec's training-free methods: kind -> (class, default tree budget (its draft size), defaults)
TRAINING_FREE = {"pld": PromptLookup, "sam": SuffixAutomaton, "lookahead": LookaheadTrie,
                 "recycling": TokenRecycling}
DEFAULT_BUDGET = {"pld": 10, "sam": 10, "lookahead": 64, "recycling": 80}


def proposer_factory(kind: str, vocab_size: int, **params):
    """A zero-argument factory of fresh per-sample proposers of `kind` (MMSpec Table 6 defaults;
    `params` override them). Token Recycling's factory shares one adjacency matrix across the
    samples it serves, as the method keeps it across requests."""
    if kind not in TRAINING_FREE:
        raise ValueError(f"unknown training-free method {kind!r}; expected one of {sorted(TRAINING_FREE)}")
    if kind == "recycling":
        import torch

        k = int(params.pop("k", 8))
        shared = torch.full((vocab_size, k), -1, dtype=torch.long)
        return lambda: TokenRecycling(vocab_size, k=k, adj_VK=shared, **params)
    cls = TRAINING_FREE[kind]
    return lambda: cls(**params)

__all__ = ["DEFAULT_BUDGET", "LookaheadTrie", "TRAINING_FREE", "proposer_factory", "PromptLookup", "Proposer",
           "RECYCLING_TEMPLATE", "StaticCorpus", "SuffixAutomaton", "TokenRecycling",
           "paths_to_tree", "propose_batch", "trees_to_batch"]
