"""LLaVA adapter against HF oracles: forward logits, get_image_features placed at the image
tokens, eager-attention entropies; left padding changes nothing for real tokens."""

import torch
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from spec_core.targets import LlavaAdapter, adapter_for
from tests.spec_core.targets.conftest import IMAGE, assert_choice_matches_brute_force, llava_batch


def test_interface(llava):
    adapter = adapter_for(llava)
    assert isinstance(adapter, LlavaAdapter)
    assert adapter.lm_head is llava.lm_head
    assert adapter.embed_tokens is llava.model.language_model.embed_tokens
    assert adapter.decoder_layer_cls is LlamaDecoderLayer
    assert adapter.text_config is llava.config.text_config
    assert (adapter.image_token_id, adapter.num_layers, adapter.default_entropy_layers) == (IMAGE, 4, (1, 10))


def test_final_hidden_gives_the_models_logits(llava):
    batch = llava_batch()
    out = adapter_for(llava).prefill(batch, return_logits=True)
    real_BT = batch["attention_mask"].bool()
    with torch.no_grad():
        expected_BTV = llava(**batch).logits  # HF's own positions (arange over the padding)
    assert torch.allclose(llava.lm_head(out.final_hidden_BTD)[real_BT], expected_BTV[real_BT], atol=1e-5)
    assert torch.equal(out.logits_BTV, llava.lm_head(out.final_hidden_BTD))
    assert out.position_ids.tolist()[0][3:] == list(range(10)) and out.position_ids[0, :3].eq(0).all()


def test_visual_tokens_are_the_projector_output_at_the_image_tokens(llava):
    batch = llava_batch()
    out = adapter_for(llava).prefill(batch, output_hidden_states=True)
    with torch.no_grad():
        per_image = llava.model.get_image_features(pixel_values=batch["pixel_values"]).pooler_output
    assert out.visual_BPD.shape == (2, 4, 32) and out.visual_valid_BP.all()
    for b in range(2):
        assert out.visual_pos_BP[b].tolist() == (batch["input_ids"][b] == IMAGE).nonzero()[:, 0].tolist()
        assert torch.allclose(out.visual_BPD[b], per_image[b], atol=1e-6)
        # and what the decoder saw there (HF's hidden_states[0] = the merged embeddings)
        assert torch.allclose(out.hidden_states[0][b, out.visual_pos_BP[b]], per_image[b], atol=1e-6)
    assert len(out.hidden_states) == 5


def test_min_entropy_layer_matches_eager_attentions(llava):
    batch = llava_batch()
    adapter = adapter_for(llava)
    out = adapter.prefill(batch, adapter.default_entropy_layers)
    assert out.entropy_layers == (1, 3)  # 1..10 clamped below the last of 4 layers
    assert_choice_matches_brute_force(llava, out, batch)
    chunked = adapter.prefill(batch, (1, 10), query_chunk=4)
    assert torch.equal(chunked.chosen_layer_BT, out.chosen_layer_BT)


def test_left_padding_does_not_change_real_tokens(llava):
    batch = llava_batch()
    adapter = adapter_for(llava)
    padded = adapter.prefill(batch, (1, 3))
    pad = int((batch["attention_mask"][0] == 0).sum())
    alone = adapter.prefill({"input_ids": batch["input_ids"][:1, pad:],
                             "pixel_values": batch["pixel_values"][:1]}, (1, 3))
    assert torch.equal(padded.chosen_layer_BT[0, pad:], alone.chosen_layer_BT[0])
    assert torch.allclose(padded.intermediate_BTD[0, pad:], alone.intermediate_BTD[0], atol=1e-5)
    assert torch.allclose(padded.final_hidden_BTD[0, pad:], alone.final_hidden_BTD[0], atol=1e-5)
    assert torch.equal(padded.visual_pos_BP[0] - pad, alone.visual_pos_BP[0])
