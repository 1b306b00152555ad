/* tbevents.c — TensorBoard event files: TFRecord framing around hand-encoded Event protos
 * (tbevents.h says which fields). Protocol-buffer encoding, as the protobuf documentation's
 * "Encoding" page defines it: each field is a key varint (field number << 3 | wire type) and then
 * its value: a varint (type 0), 8 little-endian bytes (type 1: double), a varint length and the
 * bytes (type 2: string, embedded message), or 4 little-endian bytes (type 5: float). */
#include "tbevents.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "config.h"   /* GT_PATH_MAX */
#include "paths.h"    /* gt_make_dirs */

struct gt_tb {
    FILE *f;
    int failed;
    char path[GT_PATH_MAX + 128];
};

/* ---------------------------------------------------------------- CRC-32C */

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u))); /* reflected Castagnoli */
        crc_table[i] = c;
    }
}

uint32_t gt_crc32c(const void *data, size_t n) {
    if (!crc_table[1]) crc_init();
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* TFRecord's mask: rotate right by 15 and add a constant, so that a CRC of data holding CRCs stays strong. */
uint32_t gt_tb_masked_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

/* ---------------------------------------------------------------- protobuf fields */

typedef struct {
    unsigned char b[512];
    size_t n;
} buf;

static void put_byte(buf *o, unsigned char c) {
    if (o->n < sizeof o->b) o->b[o->n] = c;
    o->n++;
}
static void put_varint(buf *o, uint64_t v) {
    do {
        put_byte(o, (unsigned char)((v & 0x7Fu) | (v >= 0x80u ? 0x80u : 0u)));
        v >>= 7;
    } while (v);
}
static void put_le(buf *o, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) put_byte(o, (unsigned char)(v >> (8 * i)));
}
static void put_key(buf *o, int field, int wire) { put_varint(o, (uint64_t)field << 3 | (uint64_t)wire); }
static void put_bytes(buf *o, int field, const void *data, size_t n) {
    put_key(o, field, 2);
    put_varint(o, n);
    for (size_t i = 0; i < n; i++) put_byte(o, ((const unsigned char *)data)[i]);
}
static void put_double(buf *o, int field, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_key(o, field, 1);
    put_le(o, bits, 8);
}
static void put_float(buf *o, int field, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_key(o, field, 5);
    put_le(o, bits, 4);
}

/* ---------------------------------------------------------------- records */

static double now_seconds(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

/* One TFRecord: length, masked CRC of the length, the data, masked CRC of the data. */
static int write_record(gt_tb *tb, const buf *event) {
    if (tb->failed) return -1;
    if (event->n > sizeof event->b) return -1; /* a tag too long for the buffer: not written */
    unsigned char head[12];
    uint64_t len = event->n;
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)(len >> (8 * i));
    uint32_t c = gt_tb_masked_crc(gt_crc32c(head, 8));
    for (int i = 0; i < 4; i++) head[8 + i] = (unsigned char)(c >> (8 * i));
    unsigned char tail[4];
    c = gt_tb_masked_crc(gt_crc32c(event->b, event->n));
    for (int i = 0; i < 4; i++) tail[i] = (unsigned char)(c >> (8 * i));
    if (fwrite(head, 1, sizeof head, tb->f) != sizeof head || fwrite(event->b, 1, event->n, tb->f) != event->n ||
        fwrite(tail, 1, sizeof tail, tb->f) != sizeof tail) {
        fprintf(stderr, "gtrain: cannot write %s: %s; TensorBoard events off\n", tb->path, strerror(errno));
        tb->failed = 1;
        return -1;
    }
    return 0;
}

gt_tb *gt_tb_open(const char *dir, char *err, size_t err_len) {
    if (gt_make_dirs(dir) != 0) {
        snprintf(err, err_len, "cannot create the directory '%s': %s", dir, strerror(errno));
        return NULL;
    }
    gt_tb *tb = calloc(1, sizeof *tb);
    if (!tb) abort();
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%lld.%s.%d.gtrain", dir, (long long)time(NULL), host,
             (int)getpid());
    tb->f = fopen(tb->path, "wb");
    if (!tb->f) {
        snprintf(err, err_len, "cannot create '%s': %s", tb->path, strerror(errno));
        free(tb);
        return NULL;
    }
    buf e = {.n = 0};
    put_double(&e, 1, now_seconds());
    put_bytes(&e, 3, "brain.Event:2", strlen("brain.Event:2")); /* Event.file_version */
    if (write_record(tb, &e) != 0 || fflush(tb->f) != 0) {
        snprintf(err, err_len, "cannot write '%s': %s", tb->path, strerror(errno));
        gt_tb_close(tb);
        return NULL;
    }
    return tb;
}

int gt_tb_scalar(gt_tb *tb, int64_t step, const char *tag, double value) {
    if (!tb) return 0;
    if (!isfinite(value)) return 0;
    buf value_msg = {.n = 0}, summary = {.n = 0}, e = {.n = 0};
    put_bytes(&value_msg, 1, tag, strlen(tag)); /* Summary.Value.tag */
    put_float(&value_msg, 2, (float)value);     /* Summary.Value.simple_value */
    if (value_msg.n > sizeof value_msg.b) return -1; /* a tag too long for the buffer: not written */
    put_bytes(&summary, 1, value_msg.b, value_msg.n); /* Summary.value */
    put_double(&e, 1, now_seconds());                 /* Event.wall_time */
    put_key(&e, 2, 0);                                /* Event.step */
    put_varint(&e, (uint64_t)step);
    if (summary.n > sizeof summary.b) return -1;
    put_bytes(&e, 5, summary.b, summary.n);           /* Event.summary */
    return write_record(tb, &e);
}

void gt_tb_write_step(gt_tb *tb, int64_t step, const gt_tb_step *s) {
    if (!tb) return;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    gt_tb_scalar(tb, step, "train/loss", s->loss);
    gt_tb_scalar(tb, step, "train/lr", s->lr);
    gt_tb_scalar(tb, step, "train/grad_norm", s->grad_norm);
    gt_tb_scalar(tb, step, "train/tokens_per_s", s->tok_per_s);
    gt_tb_scalar(tb, step, "train/step_ms", s->step_ms);
    gt_tb_scalar(tb, step, "train/mfu", s->mfu);
    gt_tb_scalar(tb, step, "memory/act_peak_GiB", s->act_peak_bytes / gib);
    gt_tb_scalar(tb, step, "memory/mem_peak_GiB", s->mem_peak_bytes / gib);
    gt_tb_scalar(tb, step, "memory/reserved_GiB", s->reserved_bytes / gib);
    if (s->save_blocking_ms > 0) gt_tb_scalar(tb, step, "save/blocking_ms", s->save_blocking_ms);
    gt_tb_flush(tb);
}

void gt_tb_flush(gt_tb *tb) {
    if (tb && !tb->failed) fflush(tb->f);
}

void gt_tb_close(gt_tb *tb) {
    if (!tb) return;
    if (tb->f) fclose(tb->f);
    free(tb);
}

const char *gt_tb_path(const gt_tb *tb) { return tb ? tb->path : ""; }
