/*
 * memsnap.c — one rank's memory snapshot slots (see memsnap.h).
 *
 * A slot file: a 4 KiB header, the payload (master, exp_avg, exp_avg_sq of the rank's range, fp32,
 * 12 bytes per element), then the config text. The writer maps the file shared and writes it with
 * stores; a process killed with SIGKILL leaves in the file every store it made (the file is the page
 * cache of the shared-memory file system), so the order of the stores is the order a reader sees
 * after a kill: the checksum field is cleared first and set last (release stores). A node that
 * reboots loses the slots, as it loses the processes: the state files on disk are the fallback.
 * The checksum is four interleaved 64-bit multiply-rotate lanes over 8-byte words (a few GB/s on one
 * core), each part hashed in turn and mixed into the next.
 */
#define _GNU_SOURCE /* fallocate, MAP_POPULATE */

#include "memsnap.h"

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testhooks.h"

#define MAGIC "GTSNAP\r\n"
#define VERSION 1u
#define HEADER_BYTES GT_MEMSNAP_HEADER_BYTES

typedef struct header {
    char magic[8];
    uint32_t version, header_bytes;
    uint32_t info_bytes, pad0;   /* sizeof(gt_state_info): the same build reads it */
    uint64_t seq;                /* refreshes of this writer so far, for a person looking at it */
    int64_t step;
    int32_t world, rank;
    uint64_t n_params, begin, count;
    uint64_t payload_bytes, config_bytes;
    char run_id[24], branch[24];
    gt_state_info info;
    uint64_t checksum;           /* over the header (this field 0), payload and config; 0 = invalid */
} header;

_Static_assert(sizeof(header) <= HEADER_BYTES, "the snapshot header fits its 4 KiB");

const char *gt_memsnap_dir(void) {
    const char *d = getenv("GTRAIN_SHM_DIR");
    return d && d[0] ? d : "/dev/shm";
}

void gt_memsnap_prefix(char *out, size_t len, const char *run_id, const char *branch) {
    snprintf(out, len, "gtrain-snap-%s-%s-w", run_id, branch);
}

void gt_memsnap_path(char *out, size_t len, const gt_memsnap_id *id, int slot) {
    static const char *const ext[4] = {"a", "b", "pa", "pb"};
    char prefix[96];
    gt_memsnap_prefix(prefix, sizeof prefix, id->run_id, id->branch);
    snprintf(out, len, "%s/%s%d-r%d.%s", gt_memsnap_dir(), prefix, id->world, id->rank, ext[slot & 3]);
}

int gt_memsnap_scan(const char *run_id, const char *branch,
                    void (*fn)(void *user, int world, int rank, int slot, const char *name), void *user) {
    static const char *const ext[4] = {"a", "b", "pa", "pb"};
    char prefix[96];
    gt_memsnap_prefix(prefix, sizeof prefix, run_id, branch);
    size_t plen = strlen(prefix);
    DIR *d = opendir(gt_memsnap_dir());
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, plen) != 0) continue;
        int world, rank, used = 0;
        char tail[4];
        /* WORLD-rRANK.EXT and nothing after it */
        if (sscanf(e->d_name + plen, "%d-r%d.%3[a-z]%n", &world, &rank, tail, &used) != 3 ||
            e->d_name[plen + used] != '\0' || world < 1 || rank < 0 || rank >= world)
            continue;
        for (int slot = 0; slot < 4; slot++)
            if (strcmp(tail, ext[slot]) == 0) fn(user, world, rank, slot, e->d_name);
    }
    closedir(d);
    return 0;
}

uint64_t gt_memsnap_slot_bytes(uint64_t count, size_t config_len) {
    return HEADER_BYTES + 12 * count + (uint64_t)config_len;
}

/* ------------------------------------------------------------------------------------------------
 * The checksum
 * ---------------------------------------------------------------------------------------------- */

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t lane(uint64_t acc, uint64_t w) { return rotl(acc + w * P2, 31) * P1; }

/* The checksum as a stream: begin, blocks of whole 32-byte groups (any number of calls), end with the
 * rest (under 32 bytes). gt_memsnap_hash is the three at once, so that a reader that checks a slot
 * while it copies it (verify_load below) computes the same sum as the writer. */
typedef struct hash_state {
    uint64_t a, b, c, d, n;
} hash_state;

static void hash_begin(hash_state *s, uint64_t h) {
    s->a = h + P1 + P2, s->b = h + P2, s->c = h, s->d = h - P1, s->n = 0;
}

static void hash_blocks(hash_state *s, const unsigned char *p, size_t n) { /* n: a multiple of 32 */
    uint64_t a = s->a, b = s->b, c = s->c, d = s->d;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, sizeof w);
        a = lane(a, w[0]);
        b = lane(b, w[1]);
        c = lane(c, w[2]);
        d = lane(d, w[3]);
    }
    s->a = a, s->b = b, s->c = c, s->d = d, s->n += n;
}

static uint64_t hash_end(const hash_state *s, const unsigned char *p, size_t n) { /* n < 32 */
    uint64_t x = rotl(s->a, 1) + rotl(s->b, 7) + rotl(s->c, 12) + rotl(s->d, 18) + (s->n + (uint64_t)n);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, sizeof w);
        x = rotl(x ^ lane(0, w), 27) * P1 + P3;
    }
    for (; i < n; i++) x = rotl(x ^ (p[i] * P3), 11) * P1;
    x ^= x >> 33;
    x *= P2;
    x ^= x >> 29;
    x *= P3;
    x ^= x >> 32;
    return x;
}

uint64_t gt_memsnap_hash(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    hash_state s;
    hash_begin(&s, h);
    size_t whole = n / 32 * 32;
    hash_blocks(&s, p, whole);
    return hash_end(&s, p + whole, n - whole);
}

/* The checksum of a whole slot image (header + payload + config), the header's field read as 0: its
 * first part (the header; *copy gets that header with the field 0), its middle (the payload, hashed
 * by pass_payload below as it is copied, by the refresh and by the load alike) and its end (the
 * config text). */
static uint64_t slot_checksum_head(const unsigned char *base, header *copy) {
    memcpy(copy, base, sizeof *copy);
    copy->checksum = 0;
    return gt_memsnap_hash(0, copy, sizeof *copy);
}

static uint64_t slot_checksum_end(uint64_t x, const unsigned char *config, const header *h) {
    x = gt_memsnap_hash(x, config, (size_t)h->config_bytes);
    return x ? x : 1; /* 0 means "not written" */
}

/* ------------------------------------------------------------------------------------------------
 * Reading
 * ---------------------------------------------------------------------------------------------- */

/* Is h (of a slot image of `size` bytes) one of id's? 1, 0 (all zero: a slot never written), or -1
 * with *bad. */
static int check_header(const header *h, const gt_memsnap_id *id, uint64_t size, const char **bad) {
    static const char empty[8];
    *bad = NULL;
    if (size < HEADER_BYTES) *bad = "shorter than a header";
    else if (memcmp(h->magic, empty, 8) == 0) return 0;
    else if (memcmp(h->magic, MAGIC, 8) != 0 || h->version != VERSION || h->header_bytes != HEADER_BYTES ||
             h->info_bytes != sizeof(gt_state_info))
        *bad = "not a snapshot of this gtrain (magic, version)";
    else if (strncmp(h->run_id, id->run_id, sizeof h->run_id) != 0 || strncmp(h->branch, id->branch, sizeof h->branch) != 0)
        *bad = "of another run or branch (its header's lineage)";
    else if (h->world != id->world || h->rank != id->rank || h->n_params != id->n_params || h->begin != id->begin ||
             h->count != id->count || h->payload_bytes != 12 * id->count)
        *bad = "of another world size, rank or slice";
    else if (size != HEADER_BYTES + h->payload_bytes + h->config_bytes)
        *bad = "truncated";
    else if (__atomic_load_n(&h->checksum, __ATOMIC_ACQUIRE) == 0)
        *bad = "incomplete (its refresh was interrupted)";
    return *bad ? -1 : 1;
}

/* Opens a slot and reads its header: 1 (fd open, *h), 0 (no file, or never written), -1 (why). */
static int open_slot(const gt_memsnap_id *id, int slot, header *h, int *fd_out, off_t *size, char *why, size_t len) {
    char path[4200];
    gt_memsnap_path(path, sizeof path, id, slot);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        snprintf(why, len, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    memset(h, 0, sizeof *h);
    const char *bad = "shorter than a header";
    int rc = -1;
    if (fstat(fd, &st) == 0 && pread(fd, h, sizeof *h, 0) == (ssize_t)sizeof *h)
        rc = check_header(h, id, (uint64_t)st.st_size, &bad);
    if (rc != 1) {
        if (rc < 0) snprintf(why, len, "%s: %s", path, bad);
        close(fd);
        return rc;
    }
    *fd_out = fd;
    *size = st.st_size;
    return 1;
}

int gt_memsnap_peek(const gt_memsnap_id *id, int slot, int64_t *step, char *why, size_t why_len) {
    header h;
    int fd;
    off_t size;
    int rc = open_slot(id, slot, &h, &fd, &size, why, why_len);
    if (rc != 1) return rc;
    close(fd);
    *step = h.step;
    return 1;
}

/* Bytes copied between two steps of the checksum: small enough that the hash reads them back from
 * the cache the copy just left them in (one pass over the slot's memory, not two). */
#define PASS_CHUNK ((size_t)256 << 10)

/* The payload (the optimizer's three groups of `count` floats, one after another in the slot image)
 * copied between the optimizer and the image chunk by chunk, each chunk hashed right after its copy;
 * the hash runs on from x and the checksum's middle is returned. to_image: a refresh (the optimizer
 * into the image), else a load. tear: the process is killed after the first group (a refresh torn, for
 * the tests: GTRAIN_TEST_MEMSNAP_KILL). */
static uint64_t pass_payload(uint64_t x, unsigned char *payload, size_t count, const gt_optim *opt, int to_image,
                             int tear) {
    size_t group = count * sizeof(float), total = 3 * group, hashed = 0;
    unsigned char *buf[3] = {(unsigned char *)opt->master, (unsigned char *)opt->exp_avg,
                             (unsigned char *)opt->exp_avg_sq};
    hash_state s;
    hash_begin(&s, x);
    for (size_t at = 0; at < total;) {
        size_t g = at / group, off = at - g * group;
        size_t len = group - off < PASS_CHUNK ? group - off : PASS_CHUNK;
        if (to_image)
            opt->ops->copy_to_host(payload + at, buf[g] + off, len);
        else
            opt->ops->copy_to_device(buf[g] + off, payload + at, len);
        at += len;
        if (tear && g == 0 && at == group) raise(SIGKILL);
        size_t upto = at / 32 * 32;
        hash_blocks(&s, payload + hashed, upto - hashed);
        hashed = upto;
    }
    return hash_end(&s, payload + hashed, total - hashed);
}

int gt_memsnap_verify_load_image(const gt_memsnap_id *id, const void *image, uint64_t size, int64_t step,
                                 gt_optim *opt, gt_state_info *info, char **config_text, char *why, size_t why_len) {
    const header *h = image;
    const char *bad = NULL;
    int rc = size >= sizeof(header) ? check_header(h, id, size, &bad) : -1;
    if (rc != 1) {
        snprintf(why, why_len, "%s", rc == 0 ? "never written" : bad ? bad : "shorter than a header");
        return -1;
    }
    if (h->step != step) {
        snprintf(why, why_len, "holds step %lld, not %lld", (long long)h->step, (long long)step);
        return -1;
    }
    uint64_t want = __atomic_load_n(&h->checksum, __ATOMIC_ACQUIRE);
    header head;
    uint64_t x = slot_checksum_head(image, &head);
    /* the payload: each chunk copied into the optimizer, then hashed while it is still in the cache */
    unsigned char *payload = (unsigned char *)image + HEADER_BYTES;
    size_t total = 3 * (size_t)head.count * sizeof(float);
    x = pass_payload(x, payload, (size_t)head.count, opt, 0, 0);
    opt->ops->synchronize();
    x = slot_checksum_end(x, payload + total, &head);
    if (x != want) {
        snprintf(why, why_len, "its checksum does not match (a refresh interrupted, or damaged)");
        return -1;
    }
    *info = head.info;
    *config_text = malloc((size_t)head.config_bytes + 1);
    if (!*config_text) abort();
    memcpy(*config_text, payload + total, (size_t)head.config_bytes);
    (*config_text)[head.config_bytes] = '\0';
    return 0;
}

void *gt_memsnap_map(const gt_memsnap_id *id, int slot, uint64_t *size, char *why, size_t why_len) {
    header h;
    int fd;
    off_t st_size;
    int rc = open_slot(id, slot, &h, &fd, &st_size, why, why_len);
    if (rc == 0) snprintf(why, why_len, "its slot is gone");
    if (rc != 1) return NULL;
    /* MAP_POPULATE: its pages are in memory already (the file system's); mapping them in one call
     * takes less time than one fault per page as the reader walks them */
    void *map = mmap(NULL, (size_t)st_size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(why, why_len, "mmap: %s", strerror(errno));
        return NULL;
    }
    *size = (uint64_t)st_size;
    return map;
}

void gt_memsnap_unmap(void *map, uint64_t size) {
    if (map) munmap(map, (size_t)size);
}

int gt_memsnap_verify_load(const gt_memsnap_id *id, int slot, int64_t step, gt_optim *opt, gt_state_info *info,
                           char **config_text, char *why, size_t why_len) {
    uint64_t size = 0;
    char path[4200], msg[512];
    gt_memsnap_path(path, sizeof path, id, slot);
    void *map = gt_memsnap_map(id, slot, &size, msg, sizeof msg);
    int rc = map ? gt_memsnap_verify_load_image(id, map, size, step, opt, info, config_text, msg, sizeof msg) : -1;
    if (rc != 0) snprintf(why, why_len, "%s: %s", path, msg);
    gt_memsnap_unmap(map, size);
    return rc;
}

/* ------------------------------------------------------------------------------------------------
 * Writing
 * ---------------------------------------------------------------------------------------------- */

struct gt_memsnap {
    gt_memsnap_id id;
    gt_memsnap_id ward;   /* the rank whose copies this one keeps (slots 2, 3); has_ward 0: none */
    int has_ward;
    char *config_text;
    size_t config_len;
    uint64_t bytes;       /* of each own slot */
    uint64_t copy_bytes;  /* of each copy */
    int fd[4];
    unsigned char *map[4];
    int next;             /* the own slot the next refresh writes (0, 1) */
    int next_copy;        /* the copy slot the next copy goes to (2, 3) */
    int last;             /* the own slot the last refresh wrote; -1: none yet */
    uint64_t seq;
};

static uint64_t slot_size(const gt_memsnap *m, int s) { return s < 2 ? m->bytes : m->copy_bytes; }

/* Slot `s` as an empty file of its size, reserved and mapped. 0 or -1 with err. */
static int make_slot(gt_memsnap *m, int s, char *err, size_t len) {
    char path[4200];
    gt_memsnap_path(path, sizeof path, s < 2 ? &m->id : &m->ward, s);
    uint64_t bytes = slot_size(m, s);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, len, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    int rc;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size == bytes && (uint64_t)st.st_blocks * 512 >= bytes) {
        /* this slot as an earlier life of the rank left it (its name is its lineage, world and rank),
         * of this size and its memory reserved: only its header is cleared, the checksum first, which
         * makes it one never written to any reader (nothing of it is used later: the next refresh
         * writes it whole, its checksum last); faulting in its size again would cost a tenth of a
         * second per 0.5 GB for pages it already has */
        static const unsigned char zeros[HEADER_BYTES];
        const off_t at = (off_t)offsetof(header, checksum);
        rc = pwrite(fd, zeros, sizeof(uint64_t), at) == (ssize_t)sizeof(uint64_t) &&
                     pwrite(fd, zeros, HEADER_BYTES, 0) == (ssize_t)HEADER_BYTES
                 ? 0
                 : -1;
    } else {
        rc = ftruncate(fd, 0); /* whatever it held is gone before any byte of the new one is there */
        if (rc == 0) {
            rc = fallocate(fd, 0, 0, (off_t)bytes);
            if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) rc = ftruncate(fd, (off_t)bytes);
        }
    }
    void *map = rc == 0 ? mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (map == MAP_FAILED) {
        snprintf(err, len, "%s: %s (reserving %.3f GB)", path, strerror(errno), (double)bytes / 1e9);
        close(fd);
        unlink(path);
        return -1;
    }
#ifdef MADV_POPULATE_WRITE
    /* its page tables filled in one call: the first refresh into a mapping otherwise takes a fault
     * per page (0.45 GB on a 2-core VM: 0.10-0.12 s here against 0.23-0.35 s more in that refresh), and
     * memory_every = auto would take that one-off for a refresh's cost. A kernel without it (before
     * Linux 5.14) says EINVAL and the pages are faulted in as they are written. */
    (void)madvise(map, (size_t)bytes, MADV_POPULATE_WRITE);
#endif
    m->fd[s] = fd;
    m->map[s] = map;
    return 0;
}

static void unmap_slot(gt_memsnap *m, int s) {
    if (m->map[s]) munmap(m->map[s], (size_t)slot_size(m, s));
    if (m->fd[s] >= 0) close(m->fd[s]);
    m->map[s] = NULL;
    m->fd[s] = -1;
}

gt_memsnap *gt_memsnap_open(const gt_memsnap_id *id, int keep_slot, const gt_memsnap_id *ward, const char *config_text,
                            char *err, size_t err_len) {
    gt_memsnap *m = calloc(1, sizeof *m);
    if (!m) abort();
    m->id = *id;
    if (ward) m->ward = *ward, m->has_ward = 1;
    m->config_len = strlen(config_text);
    m->config_text = strdup(config_text);
    if (!m->config_text) abort();
    m->bytes = gt_memsnap_slot_bytes(id->count, m->config_len);
    m->copy_bytes = ward ? gt_memsnap_slot_bytes(ward->count, m->config_len) : 0;
    for (int s = 0; s < 4; s++) m->fd[s] = -1;
    for (int s = 0; s < (m->has_ward ? 4 : 2); s++) {
        if (s == keep_slot) continue; /* made when it is next written */
        if (make_slot(m, s, err, err_len) != 0) {
            gt_memsnap_remove(m);
            return NULL;
        }
    }
    m->next = keep_slot == 0 ? 1 : 0;
    m->next_copy = 2;
    m->last = -1;
    return m;
}

const void *gt_memsnap_last_image(const gt_memsnap *m, uint64_t *bytes) {
    if (m->last < 0 || !m->map[m->last]) return NULL;
    *bytes = m->bytes;
    return m->map[m->last];
}

uint64_t gt_memsnap_copy_bytes(const gt_memsnap *m) { return m->has_ward ? m->copy_bytes : 0; }

unsigned char *gt_memsnap_copy_begin(gt_memsnap *m, char *err, size_t err_len) {
    int s = m->next_copy;
    if (!m->has_ward || (!m->map[s] && make_slot(m, s, err, err_len) != 0)) return NULL;
    header *h = (header *)m->map[s];
    __atomic_store_n(&h->checksum, 0, __ATOMIC_RELEASE); /* invalid until copy_end */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return m->map[s];
}

int gt_memsnap_copy_end(gt_memsnap *m, const void *head, char *err, size_t err_len) {
    int s = m->next_copy;
    const header *in = head;
    const char *bad = NULL;
    if (check_header(in, &m->ward, m->copy_bytes, &bad) != 1) {
        snprintf(err, err_len, "the copy received from rank %d is %s", m->ward.rank, bad ? bad : "empty");
        return -1;
    }
    unsigned char *base = m->map[s];
    header copy = *in;
    copy.checksum = 0;
    memcpy(base, &copy, sizeof copy);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    __atomic_store_n(&((header *)base)->checksum, in->checksum, __ATOMIC_RELEASE);
    m->next_copy = s == 2 ? 3 : 2;
    return 0;
}

int gt_memsnap_refresh(gt_memsnap *m, const gt_optim *opt, const gt_state_info *info, char *err, size_t err_len) {
    int s = m->next;
    if (!m->map[s] && make_slot(m, s, err, err_len) != 0) return -1;
    unsigned char *base = m->map[s];
    header *h = (header *)base;
    __atomic_store_n(&h->checksum, 0, __ATOMIC_RELEASE); /* invalid from here until the end */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    header fresh;
    memset(&fresh, 0, sizeof fresh);
    memcpy(fresh.magic, MAGIC, 8);
    fresh.version = VERSION;
    fresh.header_bytes = HEADER_BYTES;
    fresh.info_bytes = sizeof(gt_state_info);
    fresh.seq = ++m->seq;
    fresh.step = info->step;
    fresh.world = m->id.world;
    fresh.rank = m->id.rank;
    fresh.n_params = m->id.n_params;
    fresh.begin = m->id.begin;
    fresh.count = m->id.count;
    fresh.payload_bytes = 12 * m->id.count;
    fresh.config_bytes = m->config_len;
    snprintf(fresh.run_id, sizeof fresh.run_id, "%s", m->id.run_id);
    snprintf(fresh.branch, sizeof fresh.branch, "%s", m->id.branch);
    fresh.info = *info;
    memcpy(base, &fresh, sizeof fresh); /* its checksum field is 0 */
    unsigned char *payload = base + HEADER_BYTES;
    const gt_test_hooks *hooks = gt_test_hooks_get();
    int tear = hooks->memsnap_kill.step && hooks->memsnap_kill.step == info->step &&
               hooks->memsnap_kill.rank == m->id.rank;
    opt->ops->synchronize();
    header head;
    uint64_t sum = pass_payload(slot_checksum_head(base, &head), payload, (size_t)m->id.count, opt, 1, tear);
    opt->ops->synchronize();
    memcpy(payload + fresh.payload_bytes, m->config_text, m->config_len);
    sum = slot_checksum_end(sum, payload + fresh.payload_bytes, &fresh);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    __atomic_store_n(&h->checksum, sum, __ATOMIC_RELEASE);
    m->last = s;
    m->next = 1 - s;
    (void)err;
    (void)err_len;
    return 0;
}

void gt_memsnap_close(gt_memsnap *m) {
    if (!m) return;
    for (int s = 0; s < 4; s++) unmap_slot(m, s);
    free(m->config_text);
    free(m);
}

void gt_memsnap_remove(gt_memsnap *m) {
    if (!m) return;
    for (int s = 0; s < (m->has_ward ? 4 : 2); s++) {
        char path[4200];
        gt_memsnap_path(path, sizeof path, s < 2 ? &m->id : &m->ward, s);
        unmap_slot(m, s);
        unlink(path);
    }
    gt_memsnap_close(m);
}
