"""Training-free drafters over one sample's token history (MMSpec's PLD, SAM, Lookahead, Recycling)
and the glue from their candidate paths to a batched `DraftTree`."""

from spec_core.decoding.proposers.paths import Proposer, paths_to_tree, propose_batch, trees_to_batch
from spec_core.decoding.proposers.pld import PromptLookup
from spec_core.decoding.proposers.recycling import RECYCLING_TEMPLATE, TokenRecycling
from spec_core.decoding.proposers.suffix_automaton import StaticCorpus, SuffixAutomaton
from spec_core.decoding.proposers.trie import LookaheadTrie

__all__ = ["LookaheadTrie", "PromptLookup", "Proposer", "RECYCLING_TEMPLATE", "StaticCorpus",
           "SuffixAutomaton", "TokenRecycling", "paths_to_tree", "propose_batch", "trees_to_batch"]
