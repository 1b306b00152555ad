/*
 * hf_import.h — starting a run from a Hugging Face LLaMA checkpoint directory (`model.init = DIR`):
 * DIR/config.json, then DIR/model.safetensors, or the shards DIR/model-0000i-of-0000n.safetensors
 * listed by DIR/model.safetensors.index.json.
 *
 * config.json (read by hf_config.c) fills the [model] keys the INI leaves out and is checked against
 * the ones it sets (hf_config.c, gt_config_apply_init): the effective config stays the one description
 * of the run (state files store it), and every mismatch is named in one message.
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

/* gt_hf_read_config (config.json's [model] values) is declared in config.h: config.c uses it for
 * model.init. This compares DIR/config.json with cfg->model, as gt_config_apply_init does without
 * taking anything: every mismatch in one message naming the keys, both values and where each INI
 * value was set ("run.ini:12", the command line, or the default). 0, or 2 with err. */
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
