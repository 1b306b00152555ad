# The whole model against Hugging Face transformers' LlamaForCausalLM: logits, loss and every
# parameter gradient from tests/fixtures/llama_gqa_tiny.bin (regenerate with
# tests/fixtures/make_llama_fixture.py; see tests/fixtures/README.md), plus bit-identical gradients
# under every recompute policy; and documents inside a packed window (document masking, RoPE positions
# restarting) against tests/fixtures/llama_docmask_tiny.bin (make_docmask_fixture.py).
gtrain_add_c_test(test_model_vs_hf
  SOURCES test_model_vs_hf.c fixture_io.c
  LABELS unit
  ARGS ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/llama_gqa_tiny.bin ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/llama_docmask_tiny.bin)
