/*
 * memsnap.h — one rank's memory snapshot of its training state (checkpoint.memory_every): the bytes
 * a save writes for the rank's slice (fp32 master weights and both Adam moments of the range the
 * optimizer owns), the attributes a resume restores (gt_state_info: step, data cursor, AdamW's t,
 * tokens, skipped steps, the lineage) and the run's config text, in a file in node-local shared
 * memory ($GTRAIN_SHM_DIR, else /dev/shm) that outlives the process, so that a restart of a killed
 * rank on the same node finds it. docs/reliability.md ("The last step in memory") is the long form.
 *
 * Two slots per rank, DIR/gtrain-snap-RUNID-BRANCH-wWORLD-rRANK.a and .b; a refresh writes the one
 * that does not hold the newest snapshot, in this order: the checksum field set to 0 (invalid), the
 * header, the payload, the config text, and last the checksum (64 bits over the header and all that
 * follows). A process killed at any moment of a refresh leaves that slot failing verification and
 * the other slot as it was. Slots 2 and 3 (.pa, .pb) are the copies a rank keeps of its ward's
 * snapshot (the rank whose partner it is, on another node), written in the same order. This file knows nothing of MPI, of when to refresh or which step to
 * resume: runstate_memsnap.c decides that.
 */
#ifndef GT_MEMSNAP_H
#define GT_MEMSNAP_H

#include <stddef.h>
#include <stdint.h>

#include "optim.h"
#include "state.h"

#define GT_MEMSNAP_HEADER_BYTES 4096u /* a slot image's header; the payload follows */

/* Whose snapshot: the lineage, the world size, the rank and its flat range of n_params. */
typedef struct gt_memsnap_id {
    char run_id[24], branch[24];
    int world, rank;
    uint64_t n_params, begin, count;
} gt_memsnap_id;

/* The directory of the slots: $GTRAIN_SHM_DIR when set and not empty, else /dev/shm. */
const char *gt_memsnap_dir(void);

/* The path of slot 0 (.a) or 1 (.b) of id, or of a partner's copy of id's snapshot, 2 (.pa) or 3
 * (.pb): kept by the rank whose partner id->rank is, on its own node. */
void gt_memsnap_path(char *out, size_t len, const gt_memsnap_id *id, int slot);

/* The file prefix of every slot of a lineage (any world, any rank): "gtrain-snap-RUNID-BRANCH-w". */
void gt_memsnap_prefix(char *out, size_t len, const char *run_id, const char *branch);

/* Calls fn once for every slot file of the lineage (run_id, branch) in the slots' directory, of any
 * world size and rank: its world, rank, slot (0-3 as gt_memsnap_path names them) and file name (in
 * that directory). Names that only start like one are skipped. 0, or -1 when the directory cannot be
 * read. Nothing is opened: what a file holds is for gt_memsnap_peek to say. */
int gt_memsnap_scan(const char *run_id, const char *branch,
                    void (*fn)(void *user, int world, int rank, int slot, const char *name), void *user);

/* Bytes of one slot file for a slice of `count` elements and a config text of config_len bytes. */
uint64_t gt_memsnap_slot_bytes(uint64_t count, size_t config_len);

/* The header of a slot, without reading the payload: 1 with *step when the file is there and its
 * header is one of id's (magic, version, lineage, world, rank, range, sizes; a checksum set); 0 when
 * there is no such file; -1 when the file is there but not usable as id's (why: one phrase). */
int gt_memsnap_peek(const gt_memsnap_id *id, int slot, int64_t *step, char *why, size_t why_len);

/* Verifies slot `slot` of id and loads it into opt in one pass over its memory: the header first
 * (id's, of step `step`; nothing is copied when it is not), then the payload copied into opt's master
 * weights and moments (copy_to_device) chunk by chunk, each chunk hashed as it is copied, then the
 * config; the sum compared last. 0 with *info and *config_text (malloc'd) when the slot holds step
 * `step` of id whole; -1 with why. After a -1 whose header matched, opt's master weights and moments
 * hold the slot's bytes, which did not verify: the caller must not use them (zero them, or load
 * another source over them). */
int gt_memsnap_verify_load(const gt_memsnap_id *id, int slot, int64_t step, gt_optim *opt, gt_state_info *info,
                           char **config_text, char *why, size_t why_len);

/* The same on a slot image in memory (a partner's copy fetched over MPI). */
int gt_memsnap_verify_load_image(const gt_memsnap_id *id, const void *image, uint64_t size, int64_t step,
                                 gt_optim *opt, gt_state_info *info, char **config_text, char *why, size_t why_len);

/* A slot whose header is id's, mapped read-only whole (*size bytes): to send a partner's copy. NULL
 * with why. gt_memsnap_unmap releases it. */
void *gt_memsnap_map(const gt_memsnap_id *id, int slot, uint64_t *size, char *why, size_t why_len);
void gt_memsnap_unmap(void *map, uint64_t size);

/* The writer of one rank's slots. */
typedef struct gt_memsnap gt_memsnap;

/* Opens (creates) both slots and reserves their memory (fallocate), before step 1. keep_slot (0 or
 * 1) is a slot to leave as it is (the one the run resumed from: the first refresh writes the other);
 * -1 empties both (a run that resumed from a state file, or a fresh one: a snapshot of an earlier
 * life of this lineage never survives it). NULL with err when the memory cannot be had (a full
 * shared-memory file system): the caller runs without snapshots. ward: the rank whose snapshots this
 * rank keeps copies of (slots 2 and 3, emptied here), or NULL for none. */
gt_memsnap *gt_memsnap_open(const gt_memsnap_id *id, int keep_slot, const gt_memsnap_id *ward, const char *config_text,
                            char *err, size_t err_len);

/* Writes the state after step info->step into the slot that does not hold the newest snapshot.
 * 0, or -1 with err (the slot is then left invalid). */
int gt_memsnap_refresh(gt_memsnap *m, const gt_optim *opt, const gt_state_info *info, char *err, size_t err_len);

/* The image (header, payload, config) the last refresh wrote, to send to the partner; NULL before
 * the first refresh or when it failed. */
const void *gt_memsnap_last_image(const gt_memsnap *m, uint64_t *bytes);

/* The ward's copies: their size (0 without a ward); copy_begin clears the checksum of the copy slot
 * the next copy goes to and returns its mapping (the caller writes the payload and config at byte
 * 4096 on), copy_end checks the received header against the ward and writes it, its checksum last.
 * NULL / -1 with err. */
uint64_t gt_memsnap_copy_bytes(const gt_memsnap *m);
unsigned char *gt_memsnap_copy_begin(gt_memsnap *m, char *err, size_t err_len);
int gt_memsnap_copy_end(gt_memsnap *m, const void *head, char *err, size_t err_len);

/* Deletes its slot files (and copies) and frees the writer (the run's clean end). */
void gt_memsnap_remove(gt_memsnap *m);

/* Frees the writer; the slot files stay (a run that stops with an error: a restart may use them). */
void gt_memsnap_close(gt_memsnap *m);

/* A 64-bit checksum of n bytes, continuing from h (start with 0). */
uint64_t gt_memsnap_hash(uint64_t h, const void *data, size_t n);

#endif
