/* tbevents.h — TensorBoard event files (log.tensorboard): scalars a run writes as it goes.
 *
 * One file DIR/events.out.tfevents.SECONDS.HOST.PID.gtrain per start of a run, in the format
 * TensorBoard (and `wandb sync --sync-tensorboard`) reads: TFRecord framing (a little-endian uint64
 * length, its masked CRC-32C, the record, the record's masked CRC-32C), each record one `Event`
 * protocol buffer (tensorflow/core/util/event.proto: wall_time, step, and a Summary of one tagged
 * simple_value, or the first record's file_version "brain.Event:2"). The encoder is the few fields
 * above, written by hand: no protobuf library is needed.
 */
#ifndef GT_TBEVENTS_H
#define GT_TBEVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct gt_tb gt_tb;

/* Creates DIR (and its parents) and a new event file in it. NULL with a reason in err on failure. */
gt_tb *gt_tb_open(const char *dir, char *err, size_t err_len);

/* One scalar at `step`, timed now. Non-finite values are not written (TensorBoard plots a gap).
 * Returns 0, or -1 after a write error (later calls then do nothing). */
int gt_tb_scalar(gt_tb *tb, int64_t step, const char *tag, double value);

/* One optimizer step's numbers, under the tags train/loss, train/lr, train/grad_norm,
 * train/tokens_per_s, train/step_ms, train/mfu, memory/act_peak_GiB, memory/mem_peak_GiB,
 * memory/reserved_GiB and save/blocking_ms (NaN: not written, as mfu on the CPU), then a flush. */
typedef struct gt_tb_step {
    double loss, lr, grad_norm, tok_per_s, step_ms, mfu, save_blocking_ms;
    double act_peak_bytes, mem_peak_bytes, reserved_bytes;
} gt_tb_step;
void gt_tb_write_step(gt_tb *tb, int64_t step, const gt_tb_step *s);

/* Hands what was written to the kernel, so that a TensorBoard watching DIR sees it now. */
void gt_tb_flush(gt_tb *tb);

/* Flushes and closes; NULL is fine. */
void gt_tb_close(gt_tb *tb);

/* The path of the event file (for messages). */
const char *gt_tb_path(const gt_tb *tb);

/* CRC-32C (Castagnoli) of n bytes, and TFRecord's masked form of a CRC: exposed for the tests. */
uint32_t gt_crc32c(const void *data, size_t n);
uint32_t gt_tb_masked_crc(uint32_t crc);

#endif
