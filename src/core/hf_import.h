/*
 * hf_import.h — starting a run from a Hugging Face LLaMA checkpoint directory (`model.init = DIR`):
 * DIR/config.json, then DIR/model.safetensors, or the shards DIR/model-0000i-of-0000n.safetensors
 * listed by DIR/model.safetensors.index.json.
 *
 * config.json is CHECKED against the INI's [model], never used to fill it: the INI stays the one
 * description of the run (state files store it), and a mismatch is an error naming the key and both
 * values. Both spellings of RoPE found in the wild are read: `rope_theta` + `rope_scaling` (published
 * checkpoints) and `rope_parameters` (what transformers 5 writes).
 *
 * The weights are read natively (safetensors.h parses each file's header); a rank reads only the
 * bytes of the elements it asks for (its ZeRO slice of the flat parameter vector, src/dist/shard.h)
 * and turns BF16, F16 or F32 into fp32.
 *
 * Every problem is one line naming the file and, where there is one, the tensor or key, and the
 * functions return 2 (the trainer's exit code for bad input); nothing here aborts on bad input.
 */
#ifndef GT_HF_IMPORT_H
#define GT_HF_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "model.h"
#include "safetensors.h"

/* ---- config.json ---- */

/* The [model] values DIR/config.json determines (dim, n_layers, n_heads, n_kv_heads, vocab_size,
 * ffn_dim, norm_eps, rope_theta, rope_type and rope_*, tie_word_embeddings; max_seq_len from
 * max_position_embeddings). Refuses attention_bias/mlp_bias true, a head_dim other than
 * hidden_size/num_attention_heads, activations other than silu and RoPE types other than default
 * and llama3. 0, or 2 with err. */
int gt_hf_read_config(const char *dir, gt_model_config *out, char *err, size_t err_len);

/* Compares DIR/config.json with cfg->model. max_seq_len and dropout are the run's choice and not
 * compared. 0, or 2 with err naming the key, both values and where the INI value was set
 * ("run.ini:12", the command line, or the default). */
int gt_hf_check_config(const char *dir, const gt_config *cfg, char *err, size_t err_len);

/* ---- weights ---- */

/* Reads elements [begin, end) of the flat parameter vector of `layout` (tensors back to back in
 * layout order) from the checkpoint in DIR into out (end - begin fp32). Checks first that every tensor
 * of the layout is there with its shape and that nothing else is (lm_head.weight of a tied model and
 * rotary_emb.inv_freq buffers are ignored). *n_files receives the number of safetensors files.
 * 0, or 2 with err naming the file and the tensor. */
int gt_hf_read_slice(const char *dir, const gt_layout *layout, size_t begin, size_t end, float *out, int *n_files,
                     char *err, size_t err_len);

#endif
