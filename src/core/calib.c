/*
 * calib.c — the time model's rates: the run's key, stated defaults, and the JSON file (calib.h).
 * The measurements themselves are gtrain --calibrate's (gtrain_main.c, calibrate.c).
 */
#include "calib.h"
#include "ops.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *openblas_get_config(void);

static void copy_str(char *dst, size_t len, const char *src) {
    snprintf(dst, len, "%s", src ? src : "");
}

static void cpu_model(char *out, size_t len) {
    copy_str(out, len, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *v = strchr(line, ':');
        if (!v) break;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        copy_str(out, len, v);
        out[strcspn(out, "\n")] = '\0';
        break;
    }
    fclose(f);
}

void gt_calib_key(gt_calib *c, int gpu, int bf16) {
    memset(c, 0, sizeof *c);
    if (gethostname(c->host, sizeof c->host) != 0) copy_str(c->host, sizeof c->host, "unknown");
    c->host[sizeof c->host - 1] = '\0';
    copy_str(c->backend, sizeof c->backend, gpu ? "cuda" : "cpu");
    copy_str(c->precision, sizeof c->precision, bf16 ? "bf16" : "fp32");
    c->threads = omp_get_max_threads();
    c->ranks_per_node = 1;
    if (gpu) {
        /* the name is known once a device is selected; --plan touches no GPU and matches any */
        /* declared in comm.h; not included here to keep the core's headers apart */
        extern const char *gt_cuda_device_name(void);
        copy_str(c->device, sizeof c->device, gt_cuda_device_name());
        char v[200];
        gt_cuda_versions(v, sizeof v);
        copy_str(c->versions, sizeof c->versions, v);
    } else {
        cpu_model(c->device, sizeof c->device);
        const char *blas = openblas_get_config();
        char v[256];
        snprintf(v, sizeof v, "%.200s; jansson %s", blas ? blas : "BLAS", JANSSON_VERSION);
        copy_str(c->versions, sizeof c->versions, v);
    }
}

void gt_calib_defaults(gt_calib *c, int gpu, int bf16) {
    c->measured = 0;
    c->n_gemm = 0;
    c->n_kernel = 0;
    c->ranks_measured = 0;
    c->rank_spread = 1;
    c->n_in_step = 0;
    c->in_step_factor = 1;
    if (gpu) {
        /* NVIDIA H100 / H200 SXM datasheets: dense tensor-core bf16 989 TFLOP/s, fp32 67 TFLOP/s;
         * HBM3e 4.8 TB/s (H200; H100 3.35 TB/s); NVLink 4 900 GB/s total (450 GB/s per direction).
         * Collective latency: 10 us, an assumption (neither a datasheet figure nor a measurement). */
        double peak = bf16 ? 989e12 : 67e12;
        c->matmul_flops_per_s = peak;
        c->attn_fwd_flops_per_s = peak;
        c->attn_bwd_flops_per_s = peak;
        c->mem_bytes_per_s = 4.8e12;
        c->optim_bytes_per_s = 4.8e12;
        c->coll_latency_s = c->node_latency_s = 10e-6;
        c->coll_bytes_per_s = c->node_bytes_per_s = 450e9;
        /* between nodes: 400 Gb/s InfiniBand NDR per GPU (a DGX H100's eight ConnectX-7), 50 GB/s a
         * direction; its latency, 20 us, an assumption as above */
        c->net_latency_s = 20e-6;
        c->net_bytes_per_s = 50e9;
        c->peak_flops = peak;
        copy_str(c->source, sizeof c->source,
                 "defaults: NVIDIA H200 SXM datasheet peaks (989/67 TFLOP/s bf16/fp32, 4.8 TB/s HBM3e, 450 GB/s "
                 "NVLink per direction, 50 GB/s InfiniBand NDR between nodes), not measured");
    } else {
        c->matmul_flops_per_s = bf16 ? 100e9 : 50e9;
        c->attn_fwd_flops_per_s = 10e9;
        c->attn_bwd_flops_per_s = 10e9;
        c->mem_bytes_per_s = 10e9;
        c->optim_bytes_per_s = 10e9;
        c->coll_latency_s = c->node_latency_s = 20e-6;
        c->coll_bytes_per_s = c->node_bytes_per_s = 5e9;
        c->net_latency_s = 50e-6; /* 10 Gbit/s Ethernet */
        c->net_bytes_per_s = 1.25e9;
        c->peak_flops = 0;
        copy_str(c->source, sizeof c->source,
                 "defaults: CPU guesses (50 GFLOP/s GEMM, 10 GB/s memory, 5 GB/s between ranks, 1.25 GB/s between "
                 "nodes), not measured");
    }
}

/* The directory of the keyed files: $XDG_CACHE_HOME/gtrain, else ~/.cache/gtrain. 0 or -1 (neither set). */
static int calib_dir(char *dir, size_t len) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(dir, len, "%s/gtrain", xdg);
    else if (home && *home) snprintf(dir, len, "%s/.cache/gtrain", home);
    else return -1;
    return 0;
}

/* A key's file name up to its ranks per node: "calibration-HOST-BACKEND-PRECISION-tTHREADS-r" */
static void name_stem(const gt_calib *k, char *stem, size_t len) {
    char host[64];
    copy_str(host, sizeof host, k->host);
    for (char *p = host; *p; p++)
        if (*p == '/' || *p == ' ') *p = '_';
    snprintf(stem, len, "calibration-%s-%s-%s-t%d-r", host, k->backend, k->precision, k->threads);
}

int gt_calib_path(const gt_calib *k, char *path, size_t len) {
    const char *env = getenv("GTRAIN_CALIBRATION");
    if (env && *env) {
        copy_str(path, len, env);
        return 0;
    }
    char dir[4096], stem[256];
    if (calib_dir(dir, sizeof dir) != 0) return -1;
    name_stem(k, stem, sizeof stem);
    if ((size_t)snprintf(path, len, "%s/%s%d.json", dir, stem, k->ranks_per_node) >= len) return -1;
    return 0;
}

static const char *jstr(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static double jnum(json_t *o, const char *k, int *ok) {
    json_t *v = json_object_get(o, k);
    if (!json_is_number(v)) {
        *ok = 0;
        return 0;
    }
    return json_number_value(v);
}

/* gt_calib_load, and with any_ranks the file of another count of ranks per node too (the caller
 * says so) */
static int load_file(const char *path, const gt_calib *key, int any_ranks, gt_calib *out, char *err, size_t err_len) {
    if (access(path, F_OK) != 0) return 1;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        snprintf(err, err_len, "%s, line %d: %s", path, je.line, je.text);
        return -1;
    }
    gt_calib c;
    memset(&c, 0, sizeof c);
    json_t *k = json_object_get(root, "key"), *r = json_object_get(root, "rates");
    int ok = json_is_object(k) && json_is_object(r);
    const char *fields[] = {"host", "device", "backend", "precision", "versions"};
    char *dst[] = {c.host, c.device, c.backend, c.precision, c.versions};
    size_t dlen[] = {sizeof c.host, sizeof c.device, sizeof c.backend, sizeof c.precision, sizeof c.versions};
    for (int i = 0; ok && i < 5; i++) {
        const char *s = jstr(k, fields[i]);
        if (!s) ok = 0;
        else copy_str(dst[i], dlen[i], s);
    }
    if (!ok) {
        snprintf(err, err_len, "%s: not a gtrain calibration file (expected objects \"key\" and \"rates\" with "
                               "host, device, backend, precision, versions)", path);
        json_decref(root);
        return -1;
    }
    c.threads = (int)jnum(k, "threads", &ok);
    int has_ranks = 1; /* a file of an older gtrain has none: 0, another count than any run's */
    c.ranks_per_node = (int)jnum(k, "ranks_per_node", &has_ranks);
    /* the device is matched where the run's key names one (--plan on a GPU does not open the device) */
    const char *diff = strcmp(c.host, key->host) ? "host" : strcmp(c.backend, key->backend) ? "backend"
                       : strcmp(c.precision, key->precision) ? "precision" : c.threads != key->threads ? "threads"
                       : !any_ranks && c.ranks_per_node != key->ranks_per_node ? "number of ranks per node"
                       : key->device[0] && strcmp(c.device, key->device) ? "device"
                       : strcmp(c.versions, key->versions) ? "set of libraries" : NULL;
    if (diff) {
        char both[450] = ""; /* the libraries' versions, and the BLAS kernels OpenBLAS (or gtrain_main.c) chose */
        if (strcmp(diff, "set of libraries") == 0)
            snprintf(both, sizeof both, " [%.200s], this run has [%.200s]", c.versions, key->versions);
        snprintf(err, err_len, "%s: measured for another %s%s (run gtrain --calibrate again)", path, diff, both);
        json_decref(root);
        return -1;
    }
    const char *src = jstr(root, "source");
    copy_str(c.source, sizeof c.source, src ? src : "measured");
    c.measured = 1;
    c.matmul_flops_per_s = jnum(r, "matmul_flops_per_s", &ok);
    c.attn_fwd_flops_per_s = jnum(r, "attention_forward_flops_per_s", &ok);
    c.attn_bwd_flops_per_s = jnum(r, "attention_backward_flops_per_s", &ok);
    c.mem_bytes_per_s = jnum(r, "memory_bytes_per_s", &ok);
    c.optim_bytes_per_s = jnum(r, "optimizer_bytes_per_s", &ok);
    c.coll_latency_s = jnum(r, "collective_latency_s", &ok);
    c.coll_bytes_per_s = jnum(r, "collective_bytes_per_s", &ok);
    /* per link kind (absent in a file of an older gtrain: its one pair, whatever a run spans; 0: not
     * measured) */
    int has_links = 1;
    c.node_latency_s = jnum(r, "within_node_latency_s", &has_links);
    c.node_bytes_per_s = jnum(r, "within_node_bytes_per_s", &has_links);
    c.net_latency_s = jnum(r, "between_nodes_latency_s", &has_links);
    c.net_bytes_per_s = jnum(r, "between_nodes_bytes_per_s", &has_links);
    c.overlap_between_nodes = (int)jnum(r, "overlap_between_nodes", &has_links);
    if (!has_links || c.node_latency_s < 0 || c.node_bytes_per_s < 0 || c.net_latency_s < 0 || c.net_bytes_per_s < 0) {
        c.node_latency_s = c.net_latency_s = c.coll_latency_s;
        c.node_bytes_per_s = c.net_bytes_per_s = c.coll_bytes_per_s;
        c.overlap_between_nodes = 0;
    }
    int has_overlap = 1; /* absent in a file of an older gtrain, or of one rank: the collectives as alone */
    c.overlap_bytes_per_s = jnum(r, "overlap_bytes_per_s", &has_overlap);
    c.overlap_compute_s_per_byte = jnum(r, "overlap_compute_s_per_byte", &has_overlap);
    if (!has_overlap || c.overlap_bytes_per_s < 0 || c.overlap_compute_s_per_byte < 0)
        c.overlap_bytes_per_s = 0, c.overlap_compute_s_per_byte = 0;
    c.peak_flops = jnum(r, "peak_flops", &ok);
    int has_spread = 1; /* absent in a file of an older gtrain: as one rank's */
    c.ranks_measured = (int)jnum(r, "ranks_measured", &has_spread);
    c.rank_spread = jnum(r, "rank_spread", &has_spread);
    if (!has_spread) c.ranks_measured = 1, c.rank_spread = 1;
    c.in_step_factor = 1; /* chosen per model (gt_calib_select_in_step); absent in an older gtrain's file */
    c.n_in_step = 0;
    json_t *is = json_object_get(r, "in_step");
    for (size_t i = 0; json_is_array(is) && i < json_array_size(is) && c.n_in_step < GT_CALIB_MAX_IN_STEP; i++) {
        json_t *e = json_array_get(is, i);
        int eok = 1;
        gt_calib_in_step f = {(int)jnum(e, "dim", &eok), (int)jnum(e, "ffn_dim", &eok), (int)jnum(e, "n_heads", &eok),
                              (int)jnum(e, "vocab_size", &eok), (int)jnum(e, "seq_len", &eok), jnum(e, "factor", &eok), 0};
        int has_b = 1; /* absent in an older gtrain's file: one size, not recorded */
        f.micro_batch = (int)jnum(e, "micro_batch", &has_b);
        if (!has_b || f.micro_batch < 0) f.micro_batch = 0;
        if (eok && f.factor > 0) c.in_step[c.n_in_step++] = f;
    }
    json_t *g = json_object_get(r, "gemm");
    if (json_is_array(g)) {
        for (size_t i = 0; i < json_array_size(g) && c.n_gemm < GT_CALIB_MAX_GEMMS; i++) {
            json_t *e = json_array_get(g, i);
            gt_calib_gemm *m = &c.gemm[c.n_gemm++];
            m->n = (int)jnum(e, "n", &ok);
            m->ic = (int)jnum(e, "ic", &ok);
            m->oc = (int)jnum(e, "oc", &ok);
            m->fwd_flops_per_s = jnum(e, "forward_flops_per_s", &ok);
            m->bwd_flops_per_s = jnum(e, "backward_flops_per_s", &ok);
        }
    }
    json_t *kr = json_object_get(r, "kernels"); /* absent in files written before kernels were measured */
    if (json_is_array(kr)) {
        for (size_t i = 0; i < json_array_size(kr) && c.n_kernel < GT_CALIB_MAX_KERNELS; i++) {
            json_t *e = json_array_get(kr, i);
            gt_calib_kernel *k = &c.kernel[c.n_kernel++];
            const char *op = jstr(e, "op");
            if (!op) ok = 0;
            copy_str(k->op, sizeof k->op, op);
            k->amount = jnum(e, "amount", &ok);
            k->seconds = jnum(e, "seconds", &ok);
            if (k->amount <= 0 || k->seconds <= 0) ok = 0;
        }
    }
    json_decref(root);
    if (!ok || c.matmul_flops_per_s <= 0 || c.attn_fwd_flops_per_s <= 0 || c.attn_bwd_flops_per_s <= 0 ||
        c.mem_bytes_per_s <= 0 || c.optim_bytes_per_s <= 0 || c.coll_bytes_per_s <= 0 || c.coll_latency_s < 0) {
        snprintf(err, err_len, "%s: a rate is missing, not a number or not positive", path);
        return -1;
    }
    *out = c;
    return 0;
}

int gt_calib_load(const char *path, const gt_calib *key, gt_calib *out, char *err, size_t err_len) {
    return load_file(path, key, 0, out, err, err_len);
}

static int make_dirs(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        int rc = mkdir(path, 0777);
        *p = '/';
        if (rc != 0 && errno != EEXIST) return -1;
    }
    return 0;
}

int gt_calib_save(const char *path, const gt_calib *c, char *err, size_t err_len) {
    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp || make_dirs(tmp) != 0) {
        snprintf(err, err_len, "%s: cannot make its directory: %s", path, strerror(errno));
        return -1;
    }
    json_t *gemm = json_array();
    for (int i = 0; i < c->n_gemm; i++)
        json_array_append_new(gemm, json_pack("{s:i,s:i,s:i,s:f,s:f}", "n", c->gemm[i].n, "ic", c->gemm[i].ic, "oc",
                                              c->gemm[i].oc, "forward_flops_per_s", c->gemm[i].fwd_flops_per_s,
                                              "backward_flops_per_s", c->gemm[i].bwd_flops_per_s));
    json_t *kernels = json_array();
    for (int i = 0; i < c->n_kernel; i++)
        json_array_append_new(kernels, json_pack("{s:s,s:f,s:f}", "op", c->kernel[i].op, "amount", c->kernel[i].amount,
                                                 "seconds", c->kernel[i].seconds));
    json_t *root = json_pack(
        "{s:i,s:s,s:{s:s,s:s,s:s,s:s,s:i,s:s},s:{s:f,s:o,s:f,s:f,s:f,s:o,s:f,s:f,s:f,s:f}}", "format", 1, "source",
        c->source, "key", "host", c->host, "device", c->device, "backend", c->backend, "precision", c->precision,
        "threads", c->threads, "versions", c->versions, "rates", "matmul_flops_per_s", c->matmul_flops_per_s, "gemm",
        gemm, "attention_forward_flops_per_s", c->attn_fwd_flops_per_s, "attention_backward_flops_per_s",
        c->attn_bwd_flops_per_s, "memory_bytes_per_s", c->mem_bytes_per_s, "kernels", kernels, "optimizer_bytes_per_s",
        c->optim_bytes_per_s, "collective_latency_s", c->coll_latency_s, "collective_bytes_per_s",
        c->coll_bytes_per_s, "peak_flops", c->peak_flops);
    if (root) {
        json_object_set_new(json_object_get(root, "key"), "ranks_per_node", json_integer(c->ranks_per_node));
        json_object_set_new(json_object_get(root, "rates"), "ranks_measured", json_integer(c->ranks_measured));
        json_object_set_new(json_object_get(root, "rates"), "rank_spread", json_real(c->rank_spread));
        json_object_set_new(json_object_get(root, "rates"), "overlap_bytes_per_s", json_real(c->overlap_bytes_per_s));
        json_object_set_new(json_object_get(root, "rates"), "overlap_compute_s_per_byte",
                            json_real(c->overlap_compute_s_per_byte));
        json_object_set_new(json_object_get(root, "rates"), "overlap_between_nodes",
                            json_integer(c->overlap_between_nodes));
        const char *link_keys[] = {"within_node_latency_s", "within_node_bytes_per_s", "between_nodes_latency_s",
                                   "between_nodes_bytes_per_s"};
        const double link_vals[] = {c->node_latency_s, c->node_bytes_per_s, c->net_latency_s, c->net_bytes_per_s};
        for (int i = 0; i < 4; i++)
            json_object_set_new(json_object_get(root, "rates"), link_keys[i], json_real(link_vals[i]));
        json_t *is = json_array();
        for (int i = 0; is && i < c->n_in_step; i++) {
            const gt_calib_in_step *f = &c->in_step[i];
            json_array_append_new(is, json_pack("{s:i,s:i,s:i,s:i,s:i,s:f,s:i}", "dim", f->dim, "ffn_dim", f->ffn_dim,
                                                "n_heads", f->n_heads, "vocab_size", f->vocab_size, "seq_len",
                                                f->seq_len, "factor", f->factor, "micro_batch", f->micro_batch));
        }
        json_object_set_new(json_object_get(root, "rates"), "in_step", is);
    }
    if (!root || json_dump_file(root, tmp, JSON_INDENT(2) | JSON_SORT_KEYS) != 0 || rename(tmp, path) != 0) {
        snprintf(err, err_len, "%s: cannot write it: %s", path, strerror(errno));
        json_decref(root);
        unlink(tmp);
        return -1;
    }
    json_decref(root);
    return 0;
}

/* The file of key's directory for the same key measured with the count of ranks per node nearest to
 * key's (on a tie the larger: its rates are the less optimistic) that loads: 0 with *c and path, or 1
 * when there is none. */
static int nearest_ranks(const gt_calib *key, gt_calib *c, char *path, size_t len) {
    char dir[4096], stem[256], err[512];
    if (calib_dir(dir, sizeof dir) != 0) return 1;
    name_stem(key, stem, sizeof stem);
    DIR *d = opendir(dir);
    if (!d) return 1;
    size_t sl = strlen(stem);
    int best = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, stem, sl) != 0) continue;
        char *end;
        long r = strtol(n + sl, &end, 10);
        if (end == n + sl || r < 1 || r > 1000000 || strcmp(end, ".json") != 0 || r == key->ranks_per_node) continue;
        int dist = abs((int)r - key->ranks_per_node), best_dist = abs(best - key->ranks_per_node);
        if (best > 0 && (dist > best_dist || (dist == best_dist && r < best))) continue;
        char file[4096];
        gt_calib found;
        if ((size_t)snprintf(file, sizeof file, "%s/%s", dir, n) >= sizeof file || strlen(file) >= len) continue;
        if (load_file(file, key, 1, &found, err, sizeof err) != 0 || found.ranks_per_node != (int)r) continue;
        best = (int)r;
        *c = found;
        memcpy(path, file, strlen(file) + 1);
    }
    closedir(d);
    return best > 0 ? 0 : 1;
}

void gt_calib_for_run(gt_calib *c, int gpu, int bf16, int threads, int ranks_per_node, const char *explicit_path,
                      char *note, size_t note_len) {
    gt_calib key;
    gt_calib_key(&key, gpu, bf16);
    if (threads > 0) key.threads = threads;
    if (ranks_per_node > 0) key.ranks_per_node = ranks_per_node;
    char path[4096] = "", err[512] = "";
    const char *env = getenv("GTRAIN_CALIBRATION");
    /* a file the user named is used whatever its ranks per node (the note says so); the keyed
     * directory's own file of the run's count, else that of the nearest count */
    int named = (explicit_path && *explicit_path) || (env && *env);
    if (explicit_path && *explicit_path) copy_str(path, sizeof path, explicit_path);
    else if (gt_calib_path(&key, path, sizeof path) != 0) path[0] = '\0';
    int rc = path[0] ? load_file(path, &key, named, c, err, sizeof err) : 1;
    if (rc == 1 && !named && path[0]) rc = nearest_ranks(&key, c, path, sizeof path) == 0 ? 0 : 1;
    if (rc == 0) {
        int n = snprintf(note, note_len, "calibrated: %s (%s)", path, c->source);
        if (c->ranks_per_node != key.ranks_per_node && n >= 0 && (size_t)n < note_len) {
            char had[48];
            if (c->ranks_per_node > 0)
                snprintf(had, sizeof had, "%d rank%s per node", c->ranks_per_node, c->ranks_per_node == 1 ? "" : "s");
            else
                copy_str(had, sizeof had, "an unknown number of ranks per node");
            snprintf(note + n, note_len - (size_t)n, "; calibrated with %s; this run has %d: compute rates may be %s",
                     had, key.ranks_per_node,
                     c->ranks_per_node < key.ranks_per_node ? "optimistic" : "pessimistic");
        }
        return;
    }
    *c = key;
    gt_calib_defaults(c, gpu, bf16);
    if (rc < 0) snprintf(note, note_len, "%s; not used: %s", c->source, err);
    else snprintf(note, note_len, "%s (no calibration file %s: gtrain --calibrate CONFIG makes one)", c->source,
                  path[0] ? path : "(no HOME)");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void merge_kernels(gt_calib *c, const gt_calib *previous) {
    int n_new = c->n_kernel;
    for (int i = 0; i < previous->n_kernel && c->n_kernel < GT_CALIB_MAX_KERNELS; i++) {
        const gt_calib_kernel *k = &previous->kernel[i];
        int measured_now = 0;
        for (int j = 0; j < n_new; j++)
            measured_now |= strcmp(c->kernel[j].op, k->op) == 0 && c->kernel[j].amount == k->amount;
        if (!measured_now) c->kernel[c->n_kernel++] = *k;
    }
}

static int same_in_step_shape(const gt_calib_in_step *a, const gt_calib_in_step *b) {
    return a->dim == b->dim && a->ffn_dim == b->ffn_dim && a->n_heads == b->n_heads && a->vocab_size == b->vocab_size &&
           a->seq_len == b->seq_len;
}

void gt_calib_select_in_step(gt_calib *c, int dim, int ffn_dim, int n_heads, int vocab_size, int seq_len,
                             int micro_batch, char *note, size_t note_len) {
    gt_calib_in_step want = {dim, ffn_dim, n_heads, vocab_size, seq_len, 0, 0};
    const gt_calib_in_step *best = NULL;
    double best_d = 0;
    for (int i = 0; i < c->n_in_step; i++) {
        const gt_calib_in_step *f = &c->in_step[i];
        double d = same_in_step_shape(f, &want) ? -1 : fabs(log((double)f->dim / (dim > 0 ? dim : 1)));
        if (!best || d < best_d || (d == best_d && f->dim > best->dim)) best = f, best_d = d;
    }
    c->n_in_step_sel = 0;
    for (int i = 0; best && i < c->n_in_step; i++) { /* the chosen shape's sizes, ascending */
        if (!same_in_step_shape(&c->in_step[i], best)) continue;
        int k = c->n_in_step_sel++;
        for (; k > 0 && c->in_step_sel[k - 1].micro_batch > c->in_step[i].micro_batch; k--)
            c->in_step_sel[k] = c->in_step_sel[k - 1];
        c->in_step_sel[k] = c->in_step[i];
    }
    c->in_step_factor = c->n_in_step_sel ? gt_calib_in_step_at(c, micro_batch) : 1;
    if (!note || !note_len) return;
    if (!best) {
        snprintf(note, note_len, "in-step factor not measured (1)");
        return;
    }
    if (best_d < 0) snprintf(note, note_len, "in-step factor %.3f (this model)", c->in_step_factor);
    else snprintf(note, note_len, "in-step factor %.3f (measured on dim %d, ffn %d)", c->in_step_factor, best->dim, best->ffn_dim);
    double lo = c->in_step_sel[0].factor, hi = lo;
    for (int i = 1; i < c->n_in_step_sel; i++)
        lo = fmin(lo, c->in_step_sel[i].factor), hi = fmax(hi, c->in_step_sel[i].factor);
    size_t n = strlen(note);
    if (hi - lo >= 0.0005 && n < note_len)
        snprintf(note + n, note_len - n, ", %.3f-%.3f over micro-batches %d-%d", lo, hi, c->in_step_sel[0].micro_batch,
                 c->in_step_sel[c->n_in_step_sel - 1].micro_batch);
}

double gt_calib_in_step_at(const gt_calib *c, int micro_batch) {
    int n = c->n_in_step_sel;
    if (n == 0) return c->in_step_factor > 0 ? c->in_step_factor : 1;
    const gt_calib_in_step *s = c->in_step_sel;
    double b = micro_batch > 0 ? micro_batch : 1;
    if (n == 1 || b <= s[0].micro_batch) return s[0].factor;
    if (b >= s[n - 1].micro_batch) return s[n - 1].factor;
    int k = 1;
    while (s[k].micro_batch < b) k++;
    if (s[k - 1].micro_batch <= 0) return s[k].factor; /* an older file's size beside a measured one */
    double x0 = log2(s[k - 1].micro_batch), x1 = log2(s[k].micro_batch), w = (log2(b) - x0) / (x1 - x0);
    return s[k - 1].factor + w * (s[k].factor - s[k - 1].factor);
}

void gt_calib_merge_previous(gt_calib *c, const gt_calib *previous) {
    int n_now = c->n_in_step; /* a model measured now: every size of it is now's */
    for (int i = 0; i < previous->n_in_step && c->n_in_step < GT_CALIB_MAX_IN_STEP; i++) { /* other models' factors */
        int measured_now = 0;
        for (int k = 0; k < n_now; k++) measured_now |= same_in_step_shape(&c->in_step[k], &previous->in_step[i]);
        if (!measured_now) c->in_step[c->n_in_step++] = previous->in_step[i];
    }
    merge_kernels(c, previous);
    /* a link kind this calibration did not measure (one node, one rank per node, one rank): the earlier
     * one's; the pair of the widest kind measured then prices (calib.h) */
    if (c->node_bytes_per_s <= 0 && previous->node_bytes_per_s > 0)
        c->node_latency_s = previous->node_latency_s, c->node_bytes_per_s = previous->node_bytes_per_s;
    if (c->net_bytes_per_s <= 0 && previous->net_bytes_per_s > 0)
        c->net_latency_s = previous->net_latency_s, c->net_bytes_per_s = previous->net_bytes_per_s;
    if (c->overlap_bytes_per_s <= 0 && previous->overlap_bytes_per_s > 0) {
        c->overlap_bytes_per_s = previous->overlap_bytes_per_s;
        c->overlap_compute_s_per_byte = previous->overlap_compute_s_per_byte;
        c->overlap_between_nodes = previous->overlap_between_nodes;
    }
    gt_calib_price_widest(c);
    int n_new = c->n_gemm;
    for (int i = 0; i < previous->n_gemm && c->n_gemm < GT_CALIB_MAX_GEMMS; i++) {
        const gt_calib_gemm *g = &previous->gemm[i];
        int measured_now = 0;
        for (int k = 0; k < n_new; k++) measured_now |= c->gemm[k].ic == g->ic && c->gemm[k].oc == g->oc;
        if (!measured_now) c->gemm[c->n_gemm++] = *g;
    }
    if (c->n_gemm == n_new) return;
    double rates[GT_CALIB_MAX_GEMMS];
    for (int i = 0; i < c->n_gemm; i++) rates[i] = c->gemm[i].fwd_flops_per_s;
    qsort(rates, (size_t)c->n_gemm, sizeof rates[0], cmp_double);
    c->matmul_flops_per_s = c->n_gemm % 2 ? rates[c->n_gemm / 2]
                                          : 0.5 * (rates[c->n_gemm / 2 - 1] + rates[c->n_gemm / 2]);
}

void gt_calib_price_widest(gt_calib *c) {
    if (c->net_bytes_per_s > 0) c->coll_latency_s = c->net_latency_s, c->coll_bytes_per_s = c->net_bytes_per_s;
    else if (c->node_bytes_per_s > 0) c->coll_latency_s = c->node_latency_s, c->coll_bytes_per_s = c->node_bytes_per_s;
}

void gt_calib_select_links(gt_calib *c, int gpu, int world, int ranks_per_node, char *note, size_t note_len) {
    if (world <= 1) return;
    int net = ranks_per_node > 0 && world > ranks_per_node;
    double lat = net ? c->net_latency_s : c->node_latency_s, bw = net ? c->net_bytes_per_s : c->node_bytes_per_s;
    char kind[64], words[256];
    if (net) snprintf(kind, sizeof kind, "between nodes (%d rank%s per node)", ranks_per_node, ranks_per_node == 1 ? "" : "s");
    else snprintf(kind, sizeof kind, "within a node");
    if (bw > 0) {
        snprintf(words, sizeof words, "; collectives %s: %s", kind, c->measured ? "calibrated" : "the defaults'");
    } else {
        gt_calib d;
        memset(&d, 0, sizeof d);
        gt_calib_defaults(&d, gpu, 0);
        lat = net ? d.net_latency_s : d.node_latency_s;
        bw = net ? d.net_bytes_per_s : d.node_bytes_per_s;
        snprintf(words, sizeof words, "; collectives %s: not calibrated, the defaults' %.0f us and %.2f GB/s", kind,
                 lat * 1e6, bw / 1e9);
    }
    /* the bandwidth beside compute was measured on one kind: the other's at the same share of its own */
    double measured_on = c->overlap_between_nodes ? c->net_bytes_per_s : c->node_bytes_per_s;
    if (c->overlap_bytes_per_s > 0 && c->overlap_between_nodes != net && measured_on > 0) {
        c->overlap_bytes_per_s *= bw / measured_on;
        size_t n = strlen(words);
        snprintf(words + n, sizeof words - n, " (beside compute: scaled from %s)",
                 c->overlap_between_nodes ? "between nodes" : "within a node");
    }
    c->coll_latency_s = lat;
    c->coll_bytes_per_s = bw;
    if (note) {
        size_t n = strlen(note);
        if (n < note_len) snprintf(note + n, note_len - n, "%s", words);
    }
}

double gt_calib_gemm_rate(const gt_calib *c, int n, int ic, int oc, int backward) {
    const gt_calib_gemm *best = NULL;
    for (int i = 0; i < c->n_gemm; i++) {
        const gt_calib_gemm *g = &c->gemm[i];
        if (g->ic != ic || g->oc != oc) continue;
        if (!best || abs(g->n - n) < abs(best->n - n)) best = g;
    }
    double r = best ? (backward ? best->bwd_flops_per_s : best->fwd_flops_per_s) : 0;
    return r > 0 ? r : c->matmul_flops_per_s;
}

double gt_calib_kernel_seconds(const gt_calib *c, const char *op, double amount) {
    /* the two measured sizes around `amount`: lo the largest at or below it, hi the smallest above it;
     * lo2 the second smallest when `amount` is below every one */
    const gt_calib_kernel *lo = NULL, *hi = NULL, *lo2 = NULL;
    for (int i = 0; i < c->n_kernel; i++) {
        const gt_calib_kernel *k = &c->kernel[i];
        if (strcmp(k->op, op) != 0 || k->amount <= 0 || k->seconds <= 0) continue;
        if (k->amount <= amount) {
            if (!lo || k->amount > lo->amount) lo = k;
        } else if (!hi || k->amount < hi->amount) {
            lo2 = hi;
            hi = k;
        } else if (!lo2 || k->amount < lo2->amount) {
            lo2 = k;
        }
    }
    if (!lo && !hi) return -1;
    if (lo && !hi) return lo->seconds * amount / lo->amount; /* beyond the largest (or one size) */
    if (lo) return lo->seconds + (hi->seconds - lo->seconds) * (amount - lo->amount) / (hi->amount - lo->amount);
    double prop = hi->seconds * amount / hi->amount; /* below the smallest */
    if (!lo2) return prop;
    double line = hi->seconds + (lo2->seconds - hi->seconds) * (amount - hi->amount) / (lo2->amount - hi->amount);
    if (line > hi->seconds) line = hi->seconds;
    return line > prop ? line : prop;
}
