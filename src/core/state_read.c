/*
 * state_read.c — reading a training-state file of either layout, per rank and independently (state.c
 * states the format's rules): the attributes, /config, the tensors of this rank's slice checked
 * against the model, the rank files of the split layout, the model-only reader.
 */

#include "state.h"
#include "state_internal.h"

#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "shard.h"

/* ------------------------------------------------------------------------------------------------
 * Reading
 * ---------------------------------------------------------------------------------------------- */

#define RANK_FILES_OPEN 8 /* rank files a reader keeps open: a rank's slice maps onto one or two */

typedef struct reader {
    const char *path;
    hid_t file;
    char *err;
    size_t err_len;
    char why[256];  /* the HDF5 reason of the first failed call, captured before anything clears it */
    /* the split layout (check_rank_files): the rank files' directory, relative to path's, and how
     * many there are; 0 for a single file */
    char rank_dir[512];
    int64_t rank_files;
    int n_open, next_close;          /* the rank files open for reading: index and id */
    int64_t open_k[RANK_FILES_OPEN];
    hid_t open_f[RANK_FILES_OPEN];
} reader;

/* Call right after a failed HDF5 call: any later call clears the error stack. */
static void capture(reader *r) {
    if (!r->why[0]) H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, gt_st_innermost_error, r->why);
}

/* Records a failure (with the captured HDF5 reason when asked) and returns code. */
static int fail(reader *r, int code, int with_h5_reason, const char *fmt, ...) {
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (with_h5_reason) capture(r);
    H5Eclear2(H5E_DEFAULT);
    if (with_h5_reason && r->why[0]) snprintf(r->err, r->err_len, "%s: %s (%s)", r->path, what, r->why);
    else snprintf(r->err, r->err_len, "%s: %s", r->path, what);
    return code;
}

static int read_attr(reader *r, hid_t obj, const char *obj_name, const char *name, hid_t mem_type, void *value) {
    if (H5Aexists(obj, name) <= 0) return fail(r, GT_STATE_UNREADABLE, 1, "attribute %s%s is missing", obj_name, name);
    hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
    /* one value: H5Aread writes every element, and an array attribute would overrun `value` */
    hid_t space = attr < 0 ? -1 : H5Aget_space(attr);
    hssize_t n = space < 0 ? -1 : H5Sget_simple_extent_npoints(space);
    herr_t rc = n != 1 ? -1 : H5Aread(attr, mem_type, value);
    if (rc < 0) capture(r);
    if (space >= 0) H5Sclose(space);
    if (attr >= 0) H5Aclose(attr);
    if (n >= 0 && n != 1)
        return fail(r, GT_STATE_UNREADABLE, 0, "attribute %s%s holds %lld values (expected one)", obj_name, name,
                    (long long)n);
    if (rc < 0) return fail(r, GT_STATE_UNREADABLE, 1, "cannot read attribute %s%s", obj_name, name);
    return 0;
}

/* Elements in a dataspace (closed here): a string attribute or /config must hold exactly one, since
 * a read writes every element into a buffer sized for one. */
static hssize_t n_points(hid_t space) {
    hssize_t n = space < 0 ? -1 : H5Sget_simple_extent_npoints(space);
    if (space >= 0) H5Sclose(space);
    return n;
}

static int read_attr_str(reader *r, hid_t obj, const char *obj_name, const char *name, char *out, size_t len) {
    out[0] = '\0';
    if (H5Aexists(obj, name) <= 0) return fail(r, GT_STATE_UNREADABLE, 1, "attribute %s%s is missing", obj_name, name);
    hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t ftype = attr < 0 ? -1 : H5Aget_type(attr);
    int ok = ftype >= 0 && H5Tget_class(ftype) == H5T_STRING && !H5Tis_variable_str(ftype) &&
             n_points(H5Aget_space(attr)) == 1;
    size_t size = ok ? H5Tget_size(ftype) : 0;
    char *buf = ok ? calloc(size + 1, 1) : NULL;
    hid_t mtype = ok ? H5Tcopy(H5T_C_S1) : -1;
    if (ok) ok = buf && H5Tset_size(mtype, size) >= 0 && H5Aread(attr, mtype, buf) >= 0;
    if (!ok) capture(r);
    if (ok) snprintf(out, len, "%s", buf);
    free(buf);
    if (mtype >= 0) H5Tclose(mtype);
    if (ftype >= 0) H5Tclose(ftype);
    if (attr >= 0) H5Aclose(attr);
    return ok ? 0 : fail(r, GT_STATE_UNREADABLE, 1, "cannot read the string attribute %s%s", obj_name, name);
}

static int read_config_text(reader *r, char **text) {
    *text = NULL;
    hid_t dset = H5Dopen2(r->file, "/config", H5P_DEFAULT);
    if (dset < 0) return fail(r, GT_STATE_UNREADABLE, 1, "cannot open /config");
    hid_t ftype = H5Dget_type(dset);
    int ok = ftype >= 0 && H5Tget_class(ftype) == H5T_STRING && !H5Tis_variable_str(ftype) &&
             n_points(H5Dget_space(dset)) == 1;
    size_t size = ok ? H5Tget_size(ftype) : 0;
    char *buf = ok ? calloc(size + 1, 1) : NULL;
    hid_t mtype = ok ? H5Tcopy(H5T_C_S1) : -1;
    if (ok) ok = buf && H5Tset_size(mtype, size) >= 0 && H5Dread(dset, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0;
    if (!ok) capture(r);
    if (mtype >= 0) H5Tclose(mtype);
    if (ftype >= 0) H5Tclose(ftype);
    H5Dclose(dset);
    if (!ok) {
        free(buf);
        return fail(r, GT_STATE_UNREADABLE, 1, "cannot read /config");
    }
    *text = buf;
    return 0;
}

static void format_shape(char *out, size_t len, int ndim, const hsize_t *dims) {
    if (ndim == 1) snprintf(out, len, "[%llu]", (unsigned long long)dims[0]);
    else if (ndim == 2) snprintf(out, len, "[%llu, %llu]", (unsigned long long)dims[0], (unsigned long long)dims[1]);
    else snprintf(out, len, "(%d dimensions)", ndim);
}

typedef struct extra_search {
    const gt_layout *layout;
    char name[256];
} extra_search;

static herr_t find_extra_tensor(hid_t group, const char *name, const H5L_info_t *info, void *data) {
    extra_search *s = data;
    if (!gt_layout_find(s->layout, name)) {
        snprintf(s->name, sizeof s->name, "%s", name);
        return 1; /* stop */
    }
    return 0;
}

/* Every tensor of the layout is in `group_name` with its shape and fp32, and nothing else is. */
static int check_tensors(reader *r, const gt_layout *layout, const char *group_name) {
    hid_t group = H5Gopen2(r->file, group_name, H5P_DEFAULT);
    if (group < 0) capture(r);
    if (group < 0) return fail(r, GT_STATE_UNREADABLE, 1, "cannot open the group %s", group_name);
    int code = 0;
    for (int i = 0; i < layout->n_tensors && !code; i++) {
        const gt_tensor_info *t = &layout->tensors[i];
        htri_t exists = H5Lexists(group, t->name, H5P_DEFAULT);
        if (exists < 0) {
            capture(r);
            code = fail(r, GT_STATE_UNREADABLE, 1, "cannot look up %s/%s", group_name, t->name);
            break;
        }
        if (!exists) {
            code = fail(r, GT_STATE_INCOMPATIBLE, 0,
                        "tensor %s of the model is not in the file (%s); is it the same model?", t->name, group_name);
            break;
        }
        hid_t dset = H5Dopen2(group, t->name, H5P_DEFAULT);
        hid_t space = dset < 0 ? -1 : H5Dget_space(dset);
        hid_t type = dset < 0 ? -1 : H5Dget_type(dset);
        int ndim = space < 0 ? -1 : H5Sget_simple_extent_ndims(space);
        if (dset < 0 || space < 0 || type < 0 || ndim < 0) capture(r);
        hsize_t dims[H5S_MAX_RANK] = {0}, want[2];
        gt_st_tensor_dims(t, want);
        if (dset < 0 || space < 0 || type < 0 || ndim < 0) {
            code = fail(r, GT_STATE_UNREADABLE, 1, "cannot open %s/%s", group_name, t->name);
        } else {
            H5Sget_simple_extent_dims(space, dims, NULL);
            int same = ndim == t->ndim;
            for (int d = 0; same && d < ndim; d++) same = dims[d] == want[d];
            if (!same) {
                char have_s[64], want_s[64];
                format_shape(have_s, sizeof have_s, ndim, dims);
                format_shape(want_s, sizeof want_s, t->ndim, want);
                code = fail(r, GT_STATE_INCOMPATIBLE, 0, "tensor %s: shape %s in the file, %s in the model", t->name,
                            have_s, want_s);
            } else if (H5Tget_class(type) != H5T_FLOAT || H5Tget_size(type) != 4) {
                code = fail(r, GT_STATE_INCOMPATIBLE, 0, "%s/%s is not fp32", group_name, t->name);
            }
        }
        if (type >= 0) H5Tclose(type);
        if (space >= 0) H5Sclose(space);
        if (dset >= 0) H5Dclose(dset);
    }
    if (!code) {
        H5G_info_t ginfo;
        if (H5Gget_info(group, &ginfo) < 0) {
            capture(r);
            code = fail(r, GT_STATE_UNREADABLE, 1, "cannot list %s", group_name);
        } else if (ginfo.nlinks != (hsize_t)layout->n_tensors) {
            extra_search s = {layout, ""};
            H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, NULL, find_extra_tensor, &s);
            code = fail(r, GT_STATE_INCOMPATIBLE, 0, "tensor %s is in the file (%s) but not in the model", s.name,
                        group_name);
        }
    }
    H5Gclose(group);
    return code;
}

/* The path of rank file k of the split layout: rank_dir is relative to the top file's directory. */
static void rank_file_path(const reader *r, int64_t k, char *out, size_t len) {
    const char *slash = strrchr(r->path, '/');
    int dir_len = slash ? (int)(slash - r->path) : 1;
    const char *dir = slash ? r->path : ".";
    snprintf(out, len, "%.*s/%s/rank_%05lld.h5", dir_len, dir, r->rank_dir, (long long)k);
}

/* Opens a rank file read-only (sec2, no locking); -1 with the failure recorded. */
static hid_t open_rank_file(reader *r, const char *path) {
    FILE *probe = fopen(path, "rb");
    if (!probe) return fail(r, GT_STATE_UNREADABLE, 0, "its rank file %s: %s", path, strerror(errno)), -1;
    fclose(probe);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_sec2(fapl);
#if H5_VERSION_GE(1, 10, 7)
    H5Pset_file_locking(fapl, 0, 1);
#endif
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    if (f < 0) fail(r, GT_STATE_UNREADABLE, 1, "its rank file %s does not open as HDF5", path);
    return f;
}

/* Rank file k, opened on first use and kept open with a few others (the oldest is closed to make
 * room); -1 with the failure recorded. */
static hid_t rank_file(reader *r, int64_t k) {
    for (int i = 0; i < r->n_open; i++)
        if (r->open_k[i] == k) return r->open_f[i];
    char path[4096];
    rank_file_path(r, k, path, sizeof path);
    hid_t f = open_rank_file(r, path);
    if (f < 0) return -1;
    int slot;
    if (r->n_open < RANK_FILES_OPEN) {
        slot = r->n_open++;
    } else {
        slot = r->next_close;
        r->next_close = (slot + 1) % RANK_FILES_OPEN;
        H5Fclose(r->open_f[slot]);
    }
    r->open_k[slot] = k;
    r->open_f[slot] = f;
    return f;
}

static void close_rank_files(reader *r) {
    for (int i = 0; i < r->n_open; i++) H5Fclose(r->open_f[i]);
    r->n_open = 0;
}

/* ---------------------------------------------------------------- reading a block of a tensor
 *
 * A tensor of the top file of the split layout is a virtual dataset, and HDF5 reads a part of one
 * whose source it cannot open (a rank file that lost the dataset, a damaged object header, an EIO
 * on open) as the fill value, without an error. So gtrain never reads through it: it reads the
 * virtual dataset's mappings, checks that each is one block of the tensor filled whole from a
 * dataset of that shape in one of the rank files the top file names, and reads each part of a block
 * from its source dataset itself, where every such failure is an error; the mappings must cover
 * the block exactly. Every value read (either layout) must be finite: a state file never holds a
 * NaN or an infinity (train.nonfinite stops or skips before a save). */

typedef struct mapping {
    hsize_t start[2], size[2]; /* the block of the tensor it fills */
    int64_t k;                 /* from rank file k */
    char source[320];          /* its dataset there */
} mapping;

static int mapping_failed(reader *r, hid_t dcpl, const char *object, size_t i, const char *what) {
    capture(r);
    if (dcpl >= 0) H5Pclose(dcpl);
    return fail(r, GT_STATE_UNREADABLE, 1, "%s: mapping %zu of its virtual dataset %s", object, i, what);
}

/* The mappings of tensor dataset dset (object: its name, for messages) into *maps (malloc'd, *n of
 * them); *n = 0 when it is an ordinary dataset, read directly. */
static int virtual_mappings(reader *r, hid_t dset, const char *object, int ndim, mapping **maps, size_t *n) {
    *maps = NULL;
    *n = 0;
    hid_t dcpl = H5Dget_create_plist(dset);
    if (dcpl < 0) return mapping_failed(r, dcpl, object, 0, "cannot be read");
    H5D_layout_t layout = H5Pget_layout(dcpl);
    if (layout != H5D_VIRTUAL) {
        H5Pclose(dcpl);
        return layout < 0 ? fail(r, GT_STATE_UNREADABLE, 1, "%s: its layout cannot be read", object) : 0;
    }
    if (!r->rank_files) {
        H5Pclose(dcpl);
        return fail(r, GT_STATE_UNREADABLE, 0, "%s is a virtual dataset in a file without rank files", object);
    }
    size_t count = 0;
    if (H5Pget_virtual_count(dcpl, &count) < 0 || count == 0) return mapping_failed(r, dcpl, object, 0, "is missing");
    mapping *m = calloc(count, sizeof *m);
    if (!m) abort();
    for (size_t i = 0; i < count; i++) {
        hid_t vspace = H5Pget_virtual_vspace(dcpl, i), sspace = H5Pget_virtual_srcspace(dcpl, i);
        hsize_t lo[H5S_MAX_RANK], hi[H5S_MAX_RANK];
        int ok = vspace >= 0 && sspace >= 0 && H5Sget_select_bounds(vspace, lo, hi) >= 0 &&
                 H5Sget_simple_extent_ndims(vspace) == ndim;
        hssize_t elems = 1;
        for (int d = 0; ok && d < ndim; d++) {
            m[i].start[d] = lo[d];
            m[i].size[d] = hi[d] - lo[d] + 1;
            elems *= (hssize_t)m[i].size[d];
        }
        /* its selection is all of its bounding box (one block), filled from all of the source (whose
         * shape read_block checks: the property list does not hold it) */
        ok = ok && H5Sget_select_npoints(vspace) == elems && H5Sget_select_type(sspace) == H5S_SEL_ALL;
        if (vspace >= 0) H5Sclose(vspace);
        if (sspace >= 0) H5Sclose(sspace);
        char file_name[600] = "", expect[600], tail;
        long long k = -1;
        ssize_t name_len = ok ? H5Pget_virtual_filename(dcpl, i, file_name, sizeof file_name) : -1;
        size_t dir_len = strlen(r->rank_dir);
        ok = name_len > 0 && (size_t)name_len < sizeof file_name && strncmp(file_name, r->rank_dir, dir_len) == 0 &&
             sscanf(file_name + dir_len, "/rank_%lld.h5%c", &k, &tail) == 1 && k >= 0 && k < r->rank_files;
        if (ok) snprintf(expect, sizeof expect, "%s/rank_%05lld.h5", r->rank_dir, k);
        ok = ok && strcmp(expect, file_name) == 0; /* one of the rank files the top file names */
        ssize_t src_len = ok ? H5Pget_virtual_dsetname(dcpl, i, m[i].source, sizeof m[i].source) : -1;
        if (!ok || src_len <= 0 || (size_t)src_len >= sizeof m[i].source) {
            free(m);
            return mapping_failed(r, dcpl, object, i, "is not one block of the tensor from one of its rank files");
        }
        m[i].k = k;
    }
    H5Pclose(dcpl);
    *maps = m;
    *n = count;
    return 0;
}

/* Where block b of tensor `object` holds a value that is not finite, if anywhere: its index (in
 * the block), else -1. */
static long long first_nonfinite(const float *x, hsize_t n) {
    for (hsize_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return (long long)i;
    return -1;
}

/* Block b (ndim 1 or 2) of the tensor whose dataset is dset into dst (the block's own shape): read
 * directly (n_maps == 0), or part by part from the sources of the mappings it meets. Then every
 * value must be finite. */
static int read_block(reader *r, hid_t dset, hid_t space, const char *object, int ndim, const mapping *maps,
                      size_t n_maps, const block *b, float *dst) {
    hsize_t elems = gt_st_block_elems(ndim, b);
    if (!n_maps) {
        hid_t mspace = gt_st_select_block(space, ndim, b);
        herr_t rc = mspace < 0 ? -1 : H5Dread(dset, H5T_NATIVE_FLOAT, mspace, space, H5P_DEFAULT, dst);
        if (rc < 0) capture(r);
        if (mspace >= 0) H5Sclose(mspace);
        if (rc < 0) return fail(r, GT_STATE_UNREADABLE, 1, "reading %s failed", object);
    }
    hsize_t covered = 0;
    for (size_t i = 0; i < n_maps; i++) {
        const mapping *m = &maps[i];
        hsize_t cnt[2], at_src[2], at_mem[2], part = 1;
        for (int d = 0; d < ndim; d++) {
            hsize_t a = b->start[d] > m->start[d] ? b->start[d] : m->start[d];
            hsize_t e_b = b->start[d] + b->size[d], e_m = m->start[d] + m->size[d];
            hsize_t z = e_b < e_m ? e_b : e_m;
            cnt[d] = z > a ? z - a : 0;
            at_src[d] = a - m->start[d];
            at_mem[d] = a - b->start[d];
            part *= cnt[d];
        }
        if (!part) continue;
        char path[4096];
        rank_file_path(r, m->k, path, sizeof path);
        hid_t f = rank_file(r, m->k);
        if (f < 0) return GT_STATE_UNREADABLE;
        htri_t there = H5Lexists(f, m->source, H5P_DEFAULT);
        if (there == 0)
            return fail(r, GT_STATE_UNREADABLE, 0, "%s: its part %s is not in its rank file %s", object, m->source, path);
        hid_t src = there < 0 ? -1 : H5Dopen2(f, m->source, H5P_DEFAULT);
        hid_t sspace = src < 0 ? -1 : H5Dget_space(src);
        hid_t type = src < 0 ? -1 : H5Dget_type(src);
        hsize_t sdims[H5S_MAX_RANK] = {0};
        int ok = sspace >= 0 && type >= 0 && H5Sget_simple_extent_ndims(sspace) == ndim &&
                 H5Sget_simple_extent_dims(sspace, sdims, NULL) >= 0;
        if (!ok) capture(r);
        for (int d = 0; ok && d < ndim; d++) ok = sdims[d] == m->size[d];
        int fp32 = ok && H5Tget_class(type) == H5T_FLOAT && H5Tget_size(type) == 4;
        hid_t mspace = fp32 ? H5Screate_simple(ndim, b->size, NULL) : -1;
        herr_t rc = mspace < 0 || H5Sselect_hyperslab(sspace, H5S_SELECT_SET, at_src, NULL, cnt, NULL) < 0 ||
                            H5Sselect_hyperslab(mspace, H5S_SELECT_SET, at_mem, NULL, cnt, NULL) < 0
                        ? -1
                        : H5Dread(src, H5T_NATIVE_FLOAT, mspace, sspace, H5P_DEFAULT, dst);
        if (fp32 && rc < 0) capture(r);
        if (mspace >= 0) H5Sclose(mspace);
        if (type >= 0) H5Tclose(type);
        if (sspace >= 0) H5Sclose(sspace);
        if (src >= 0) H5Dclose(src);
        if (src < 0 || !ok)
            return fail(r, GT_STATE_UNREADABLE, 1, "%s: cannot open its part %s in its rank file %s", object, m->source,
                        path);
        if (!fp32)
            return fail(r, GT_STATE_UNREADABLE, 0, "%s: its part %s in its rank file %s is not fp32 of the block's "
                        "shape", object, m->source, path);
        if (rc < 0)
            return fail(r, GT_STATE_UNREADABLE, 1, "%s: reading its part %s in its rank file %s failed", object,
                        m->source, path);
        covered += part;
    }
    if (n_maps && covered != elems)
        return fail(r, GT_STATE_UNREADABLE, 0, "%s: its virtual dataset maps %llu of the %llu values read onto its "
                    "rank files", object, (unsigned long long)covered, (unsigned long long)elems);
    long long bad = first_nonfinite(dst, elems);
    if (bad >= 0) {
        hsize_t at[2] = {b->start[0], b->start[1]};
        if (ndim == 2) at[0] += (hsize_t)bad / b->size[1], at[1] += (hsize_t)bad % b->size[1];
        else at[0] += (hsize_t)bad;
        char where[4500] = "";
        for (size_t i = 0; i < n_maps; i++) {
            const mapping *m = &maps[i];
            int in = 1;
            for (int d = 0; d < ndim; d++) in &= at[d] >= m->start[d] && at[d] < m->start[d] + m->size[d];
            if (!in) continue;
            char path[4096];
            rank_file_path(r, m->k, path, sizeof path);
            snprintf(where, sizeof where, " (from %s in its rank file %s)", m->source, path);
            break;
        }
        char idx[64];
        if (ndim == 2) snprintf(idx, sizeof idx, "[%llu, %llu]", (unsigned long long)at[0], (unsigned long long)at[1]);
        else snprintf(idx, sizeof idx, "[%llu]", (unsigned long long)at[0]);
        return fail(r, GT_STATE_UNREADABLE, 0, "%s%s = %g is not finite%s", object, idx, (double)dst[bad], where);
    }
    return 0;
}

/* Reads this rank's slice of every tensor of one group into dst (device, slice-relative): through
 * stage, or straight into dst when stage is NULL (dst in host memory). */
static int read_group(reader *r, const gt_optim *opt, const char *group_name, float *dst, float *stage,
                      size_t max_elems) {
    const gt_layout *layout = gt_model_layout(opt->model);
    hid_t group = H5Gopen2(r->file, group_name, H5P_DEFAULT);
    if (group < 0) capture(r);
    if (group < 0) return fail(r, GT_STATE_UNREADABLE, 1, "cannot open the group %s", group_name);
    int code = 0;
    for (size_t p = 0; p < opt->n_pieces && !code; p++) {
        const gt_shard_piece *pc = &opt->pieces[p];
        const gt_tensor_info *t = &layout->tensors[pc->tensor];
        char object[320];
        snprintf(object, sizeof object, "%s/%s", group_name, t->name);
        hsize_t dims[2] = {0, 0};
        gt_st_tensor_dims(t, dims);
        hid_t dset = H5Dopen2(group, t->name, H5P_DEFAULT);
        hid_t space = dset < 0 ? -1 : H5Dget_space(dset);
        if (space < 0) capture(r);
        if (space < 0) code = fail(r, GT_STATE_UNREADABLE, 1, "cannot open %s", object);
        mapping *maps = NULL;
        size_t n_maps = 0;
        if (!code) code = virtual_mappings(r, dset, object, t->ndim, &maps, &n_maps);
        for (size_t a = 0; !code && a < pc->count; a += max_elems) {
            hsize_t n = pc->count - a < max_elems ? pc->count - a : max_elems;
            block b[3];
            int nb = gt_st_flat_blocks(t->ndim, dims, pc->start_in_tensor + a, n, b);
            /* host memory (the CPU backend): straight into the buffer, without a copy through stage;
             * the same checks of every value either way (read_block) */
            float *into = stage ? stage : dst + pc->start_in_slice + a;
            for (int i = 0; i < nb && !code; i++)
                if (gt_st_block_elems(t->ndim, &b[i]))
                    code = read_block(r, dset, space, object, t->ndim, maps, n_maps, &b[i], into + b[i].at);
            if (!code && stage) opt->ops->copy_to_device(dst + pc->start_in_slice + a, stage, n * sizeof(float));
        }
        free(maps);
        if (space >= 0) H5Sclose(space);
        if (dset >= 0) H5Dclose(dset);
    }
    H5Gclose(group);
    return code;
}

/* A top file of the split layout: every rank file it maps onto must be there, open as HDF5 and be
 * a rank file of the same step. (Every tensor read from it is then read from its rank file itself,
 * read_block, never through the virtual dataset, which would fill what it cannot read.) */
static int check_rank_files(reader *r, int64_t step) {
    int64_t n = 0;
    int code = read_attr_str(r, r->file, "/", "rank_dir", r->rank_dir, sizeof r->rank_dir);
    if (!code) code = read_attr(r, r->file, "/", "rank_files", H5T_NATIVE_INT64, &n);
    if (!code && n < 1) code = fail(r, GT_STATE_UNREADABLE, 0, "attribute /rank_files is %lld", (long long)n);
    if (code) return code;
    r->rank_files = n;
    for (int64_t k = 0; k < n && !code; k++) {
        char path[4096], format[64];
        rank_file_path(r, k, path, sizeof path);
        hid_t f = open_rank_file(r, path);
        if (f < 0) return GT_STATE_UNREADABLE;
        int64_t its_step = -1;
        code = read_attr_str(r, f, "/", "format", format, sizeof format);
        if (!code && strcmp(format, GT_STATE_FORMAT "-rank") != 0)
            code = fail(r, GT_STATE_UNREADABLE, 0, "%s is not a gtrain rank file (format '%s')", path, format);
        if (!code) code = read_attr(r, f, "/", "step", H5T_NATIVE_INT64, &its_step);
        if (!code && its_step != step)
            code = fail(r, GT_STATE_UNREADABLE, 0, "its rank file %s holds step %lld, not %lld", path,
                        (long long)its_step, (long long)step);
        H5Fclose(f);
    }
    return code;
}

/* Opens r->path read-only and checks the format attributes; the root's `step` and `world_size` are
 * returned for read_all. */
static int open_checked(reader *r, int64_t *step, int64_t *world) {
    FILE *probe = fopen(r->path, "rb");
    if (!probe) return fail(r, GT_STATE_UNREADABLE, 0, "cannot read: %s", strerror(errno));
    fclose(probe);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_sec2(fapl);
#if H5_VERSION_GE(1, 10, 7)
    H5Pset_file_locking(fapl, 0, 1); /* read-only; some parallel file systems refuse flock */
#endif
    r->file = H5Fopen(r->path, H5F_ACC_RDONLY, fapl);
    if (r->file < 0) capture(r);
    H5Pclose(fapl);
    if (r->file < 0) return fail(r, GT_STATE_UNREADABLE, 1, "cannot open as HDF5");

    char format[64];
    int64_t version = 0;
    int code = read_attr_str(r, r->file, "/", "format", format, sizeof format);
    if (!code && strcmp(format, GT_STATE_FORMAT) != 0)
        code = fail(r, GT_STATE_UNREADABLE, 0, "format is '%s', not '%s'", format, GT_STATE_FORMAT);
    if (!code) code = read_attr(r, r->file, "/", "format_version", H5T_NATIVE_INT64, &version);
    if (!code && version != GT_STATE_FORMAT_VERSION)
        code = fail(r, GT_STATE_INCOMPATIBLE, 0, "format_version %lld; this gtrain reads version %d",
                    (long long)version, GT_STATE_FORMAT_VERSION);
    if (!code) code = read_attr(r, r->file, "/", "step", H5T_NATIVE_INT64, step);
    if (!code) code = read_attr(r, r->file, "/", "world_size", H5T_NATIVE_INT64, world);
    if (!code && H5Aexists(r->file, "rank_dir") > 0) code = check_rank_files(r, *step);
    return code;
}

/* The root and /train attributes: everything in gt_state_info. */
static int read_info(reader *r, gt_state_info *info) {
    memset(info, 0, sizeof *info);
    int64_t step = 0, world = 0;
    int code = open_checked(r, &step, &world);
    if (!code) code = read_attr(r, r->file, "/", "tokens_seen", H5T_NATIVE_UINT64, &info->tokens_seen);
    if (!code) code = read_attr_str(r, r->file, "/", "shard", info->shard, sizeof info->shard);
    /* the lineage: added after format_version 1 was first written, all "" when absent (a legacy file) */
    if (!code && H5Aexists(r->file, "run_id") > 0) {
        code = read_attr_str(r, r->file, "/", "run_id", info->run_id, sizeof info->run_id);
        if (!code) code = read_attr_str(r, r->file, "/", "branch", info->branch, sizeof info->branch);
        if (!code) code = read_attr_str(r, r->file, "/", "branch_parents", info->branch_parents,
                                        sizeof info->branch_parents);
    }
    if (!code) {
        info->step = step;
        info->world_size = (int)world;
        hid_t train = H5Gopen2(r->file, "/train", H5P_DEFAULT);
        if (train < 0) capture(r);
        if (train < 0) return fail(r, GT_STATE_UNREADABLE, 1, "cannot open the group /train");
        int64_t mb = 0, ga = 0, sl = 0;
        code = read_attr(r, train, "/train/", "adam_step", H5T_NATIVE_INT64, &info->adam_step);
        if (!code) code = read_attr(r, train, "/train/", "data_cursor", H5T_NATIVE_UINT64, &info->data_cursor);
        if (!code) code = read_attr(r, train, "/train/", "seed", H5T_NATIVE_UINT64, &info->seed);
        if (!code) code = read_attr(r, train, "/train/", "global_batch", H5T_NATIVE_UINT64, &info->global_batch);
        if (!code) code = read_attr(r, train, "/train/", "micro_batch", H5T_NATIVE_INT64, &mb);
        if (!code) code = read_attr(r, train, "/train/", "grad_accum", H5T_NATIVE_INT64, &ga);
        if (!code) code = read_attr(r, train, "/train/", "seq_len", H5T_NATIVE_INT64, &sl);
        if (!code) code = read_attr(r, train, "/train/", "lr", H5T_NATIVE_DOUBLE, &info->lr);
        /* added after format_version 1 was first written: optional, 0 when absent */
        if (!code && H5Aexists(train, "skipped_steps") > 0)
            code = read_attr(r, train, "/train/", "skipped_steps", H5T_NATIVE_INT64, &info->skipped_steps);
        info->micro_batch = (int)mb;
        info->grad_accum = (int)ga;
        info->seq_len = (int)sl;
        H5Gclose(train);
    }
    return code;
}

static int read_all(reader *r, gt_optim *opt, gt_state_info *info, char **config_text) {
    int code = read_info(r, info);
    if (!code) code = read_config_text(r, config_text);

    const gt_layout *layout = gt_model_layout(opt->model);
    for (int g = 0; g < 3 && !code; g++) code = check_tensors(r, layout, GROUPS[g]);
    if (code) return code;

    size_t max_elems = gt_st_max_io_elems(), largest = 1;
    for (size_t p = 0; p < opt->n_pieces; p++)
        if (opt->pieces[p].count > largest) largest = opt->pieces[p].count;
    /* the optimizer's buffers in host memory are read into directly (read_group); a device's through stage */
    float *stage = NULL;
    if (strcmp(opt->ops->name, "cpu") != 0) {
        stage = malloc((largest < max_elems ? largest : max_elems) * sizeof(float));
        if (!stage) abort();
    }
    float *buffers[3] = {opt->master, opt->exp_avg, opt->exp_avg_sq};
    for (int g = 0; g < 3 && !code; g++) code = read_group(r, opt, GROUPS[g], buffers[g], stage, max_elems);
    free(stage);
    return code;
}

/* /model/<name> of every tensor of the layout, whole, into params at the tensor's flat offset. */
static int read_model_whole(reader *r, const gt_layout *layout, float *params) {
    int code = check_tensors(r, layout, "/model");
    for (int i = 0; i < layout->n_tensors && !code; i++) {
        const gt_tensor_info *t = &layout->tensors[i];
        char name[300];
        snprintf(name, sizeof name, "/model/%s", t->name);
        hsize_t dims[2] = {1, 1};
        gt_st_tensor_dims(t, dims);
        hid_t dset = H5Dopen2(r->file, name, H5P_DEFAULT);
        hid_t space = dset < 0 ? -1 : H5Dget_space(dset);
        if (space < 0) capture(r);
        if (space < 0) code = fail(r, GT_STATE_UNREADABLE, 1, "cannot open %s", name);
        mapping *maps = NULL;
        size_t n_maps = 0;
        if (!code) code = virtual_mappings(r, dset, name, t->ndim, &maps, &n_maps);
        /* whole: the blocks of the flat range [0, numel) */
        block b[3];
        int nb = gt_st_flat_blocks(t->ndim, dims, 0, t->numel, b);
        for (int k = 0; k < nb && !code; k++)
            if (gt_st_block_elems(t->ndim, &b[k]))
                code = read_block(r, dset, space, name, t->ndim, maps, n_maps, &b[k], params + t->offset + b[k].at);
        free(maps);
        if (space >= 0) H5Sclose(space);
        if (dset >= 0) H5Dclose(dset);
    }
    return code;
}

/* What the readers share: failures are expected here (a corrupt file is a case, not a bug), so
 * they are reported as one line instead of HDF5's error stack. Reads the config when config_text
 * is given, the optimizer's slice when opt is, and the whole /model when layout is. */
static int read_file(const char *path, gt_optim *opt, gt_state_info *info, const gt_layout *layout, float *params,
                     char **config_text, char *err, size_t err_len) {
    H5E_auto2_t old_func;
    void *old_data;
    H5Eget_auto2(H5E_DEFAULT, &old_func, &old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    reader r = {.path = path, .file = -1, .err = err, .err_len = err_len};
    err[0] = '\0';
    if (config_text) *config_text = NULL;
    int code;
    if (opt) {
        code = read_all(&r, opt, info, config_text);
    } else if (info) {
        code = read_info(&r, info);
    } else {
        int64_t step = 0, world = 0;
        code = open_checked(&r, &step, &world);
        if (!code && config_text) code = read_config_text(&r, config_text);
        if (!code && layout) code = read_model_whole(&r, layout, params);
    }
    close_rank_files(&r);
    if (r.file >= 0 && H5Fclose(r.file) < 0 && !code) code = fail(&r, GT_STATE_UNREADABLE, 1, "closing failed");
    if (code && config_text) {
        free(*config_text);
        *config_text = NULL;
    }
    H5Eclear2(H5E_DEFAULT);
    H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
    return code;
}

int gt_state_read(const char *path, gt_optim *opt, gt_state_info *info, char **config_text, char *err,
                  size_t err_len) {
    return read_file(path, opt, info, NULL, NULL, config_text, err, err_len);
}

int gt_state_read_config(const char *path, char **config_text, char *err, size_t err_len) {
    return read_file(path, NULL, NULL, NULL, NULL, config_text, err, err_len);
}

int gt_state_read_info(const char *path, gt_state_info *info, char *err, size_t err_len) {
    return read_file(path, NULL, info, NULL, NULL, NULL, err, err_len);
}

/* A root attribute or two of a file, read quietly (no HDF5 error stack), without a file lock and
 * without opening its rank files: the quick readers below. The file id, or < 0; quiet_close undoes it. */
typedef struct quiet_file {
    H5E_auto2_t old_func;
    void *old_data;
} quiet_file;

static hid_t quiet_open(const char *path, quiet_file *q) {
    H5Eget_auto2(H5E_DEFAULT, &q->old_func, &q->old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_sec2(fapl);
#if H5_VERSION_GE(1, 10, 7)
    H5Pset_file_locking(fapl, 0, 1);
#endif
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    return f;
}

static void quiet_close(hid_t f, const quiet_file *q) {
    if (f >= 0) H5Fclose(f);
    H5Eclear2(H5E_DEFAULT);
    H5Eset_auto2(H5E_DEFAULT, q->old_func, q->old_data);
}

int gt_state_read_lineage(const char *path, gt_state_info *info) {
    char err[1024], format[64];
    quiet_file q;
    reader r = {.path = path, .file = -1, .err = err, .err_len = sizeof err};
    memset(info, 0, sizeof *info);
    r.file = quiet_open(path, &q);
    int code = GT_STATE_UNREADABLE;
    if (r.file >= 0) {
        code = read_attr_str(&r, r.file, "/", "format", format, sizeof format);
        if (!code && strcmp(format, GT_STATE_FORMAT) != 0) code = GT_STATE_UNREADABLE;
        if (!code) code = read_attr(&r, r.file, "/", "step", H5T_NATIVE_INT64, &info->step);
        if (!code && H5Aexists(r.file, "run_id") > 0) {
            code = read_attr_str(&r, r.file, "/", "run_id", info->run_id, sizeof info->run_id);
            if (!code) code = read_attr_str(&r, r.file, "/", "branch", info->branch, sizeof info->branch);
            if (!code) code = read_attr_str(&r, r.file, "/", "branch_parents", info->branch_parents,
                                            sizeof info->branch_parents);
        }
    }
    quiet_close(r.file, &q);
    return code ? GT_STATE_UNREADABLE : GT_STATE_OK;
}

int gt_state_rank_dir(const char *path, char *rank_dir, size_t len) {
    char err[1024];
    quiet_file q;
    reader r = {.path = path, .file = -1, .err = err, .err_len = sizeof err};
    rank_dir[0] = '\0';
    r.file = quiet_open(path, &q);
    int rc = -1;
    if (r.file >= 0) {
        htri_t has = H5Aexists(r.file, "rank_dir");
        if (has == 0) rc = 0;
        else if (has > 0 && read_attr_str(&r, r.file, "/", "rank_dir", rank_dir, len) == 0) rc = 1;
    }
    quiet_close(r.file, &q);
    return rc;
}

int gt_state_read_model(const char *path, const gt_layout *layout, float *params, char *err, size_t err_len) {
    return read_file(path, NULL, NULL, layout, params, NULL, err, err_len);
}
