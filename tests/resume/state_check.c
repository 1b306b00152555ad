/*
 * state_check — a small inspector for training-state files, used by the resume tests (it links
 * only HDF5, no gtrain code, so it checks the files as an outside reader would):
 *
 *   state_check verify FILE              read every dataset (every Fletcher32 checksum); exit 0/1
 *   state_check compare A B [RTOL]       /model and /optim of A and B: bit-identical (no RTOL) or, per
 *                                        tensor, max|a-b| <= RTOL * max|a|; prints the worst; exit 0/1
 *   state_check chunk FILE DATASET       "OFFSET SIZE" of the dataset's first chunk in the file
 *   state_check header FILE DATASET      the file offset of the dataset's object header
 *   state_check unlink FILE DATASET      deletes the dataset from the file (a file that lost one)
 *   state_check nan FILE DATASET         writes NaN over the dataset's first element (checksums stay good)
 */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const GROUPS[3] = {"/model", "/optim/exp_avg", "/optim/exp_avg_sq"};

static hid_t open_file(const char *path) {
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        fprintf(stderr, "state_check: cannot open %s\n", path);
        exit(1);
    }
    return f;
}

/* Reads a whole float dataset; NULL on failure. */
static float *read_floats(hid_t file, const char *name, size_t *n) {
    hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
    if (d < 0) return NULL;
    hid_t s = H5Dget_space(d);
    *n = (size_t)H5Sget_simple_extent_npoints(s);
    float *buf = malloc((*n ? *n : 1) * sizeof *buf);
    herr_t rc = H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    H5Sclose(s);
    H5Dclose(d);
    if (rc < 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

typedef struct names {
    char **v;
    int n;
} names;

static herr_t collect(hid_t g, const char *name, const H5L_info_t *info, void *data) {
    names *ns = data;
    ns->v = realloc(ns->v, (size_t)(ns->n + 1) * sizeof *ns->v);
    ns->v[ns->n++] = strdup(name);
    return 0;
}

static names list_group(hid_t file, const char *group) {
    names ns = {NULL, 0};
    hid_t g = H5Gopen2(file, group, H5P_DEFAULT);
    if (g < 0) return ns;
    H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, collect, &ns);
    H5Gclose(g);
    return ns;
}

static int verify(const char *path) {
    hid_t f = open_file(path);
    int bad = 0;
    size_t total = 0;
    for (int g = 0; g < 3; g++) {
        names ns = list_group(f, GROUPS[g]);
        if (ns.n == 0) bad = 1, fprintf(stderr, "state_check: %s: %s is empty or missing\n", path, GROUPS[g]);
        for (int i = 0; i < ns.n; i++) {
            char full[512];
            snprintf(full, sizeof full, "%s/%s", GROUPS[g], ns.v[i]);
            size_t n;
            float *x = read_floats(f, full, &n);
            if (!x) bad = 1, fprintf(stderr, "state_check: %s: %s does not read back\n", path, full);
            total += x ? n : 0;
            free(x);
            free(ns.v[i]);
        }
        free(ns.v);
    }
    H5Fclose(f);
    if (!bad) printf("%s: %zu values, every checksum good\n", path, total);
    return bad;
}

static int compare(const char *a_path, const char *b_path, double rtol) {
    hid_t a = open_file(a_path), b = open_file(b_path);
    int bad = 0, tensors = 0;
    double worst = 0.0;
    char worst_name[512] = "";
    for (int g = 0; g < 3; g++) {
        names ns = list_group(a, GROUPS[g]);
        names nb = list_group(b, GROUPS[g]);
        if (ns.n != nb.n || ns.n == 0) {
            fprintf(stderr, "state_check: %s has %d tensors in %s, %s has %d\n", a_path, ns.n, GROUPS[g], b_path, nb.n);
            bad = 1;
        }
        for (int i = 0; i < ns.n; i++) {
            char full[512];
            snprintf(full, sizeof full, "%s/%s", GROUPS[g], ns.v[i]);
            size_t na, nb_;
            float *x = read_floats(a, full, &na), *y = read_floats(b, full, &nb_);
            if (!x || !y || na != nb_) {
                fprintf(stderr, "state_check: %s missing, unreadable or of another size\n", full);
                bad = 1;
            } else if (rtol < 0) {
                size_t diff = 0;
                for (size_t k = 0; k < na; k++) diff += memcmp(&x[k], &y[k], sizeof(float)) != 0;
                if (diff) {
                    fprintf(stderr, "state_check: %s: %zu of %zu values differ\n", full, diff, na);
                    bad = 1;
                }
            } else {
                double maxabs = 0, maxdiff = 0;
                for (size_t k = 0; k < na; k++) {
                    if (fabs(x[k]) > maxabs) maxabs = fabs(x[k]);
                    if (fabs((double)x[k] - y[k]) > maxdiff) maxdiff = fabs((double)x[k] - y[k]);
                }
                double rel = maxabs > 0 ? maxdiff / maxabs : maxdiff;
                if (rel > worst) worst = rel, snprintf(worst_name, sizeof worst_name, "%s", full);
                if (!(rel <= rtol)) bad = 1;
            }
            tensors++;
            free(x);
            free(y);
            free(ns.v[i]);
        }
        for (int i = 0; i < nb.n; i++) free(nb.v[i]);
        free(ns.v);
        free(nb.v);
    }
    H5Fclose(a);
    H5Fclose(b);
    if (rtol < 0) printf("%d tensors %s\n", tensors, bad ? "DIFFER" : "bit-identical");
    else printf("%d tensors, worst max|a-b|/max|a| = %.3g (%s), tolerance %.3g: %s\n", tensors, worst, worst_name, rtol,
                bad ? "FAIL" : "ok");
    return bad;
}

static int chunk(const char *path, const char *name) {
    hid_t f = open_file(path);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    haddr_t addr = 0;
    hsize_t size = 0, offset[2] = {0, 0};
    unsigned mask = 0;
    hid_t space = d < 0 ? -1 : H5Dget_space(d);
    if (space < 0 || H5Dget_chunk_info(d, space, 0, offset, &mask, &addr, &size) < 0) {
        fprintf(stderr, "state_check: no chunk info for %s in %s\n", name, path);
        return 1;
    }
    printf("%llu %llu\n", (unsigned long long)addr, (unsigned long long)size);
    H5Sclose(space);
    H5Dclose(d);
    H5Fclose(f);
    return 0;
}

static int header(const char *path, const char *name) {
    hid_t f = open_file(path);
#if H5_VERSION_GE(1, 12, 0)
    H5O_info2_t info;
    haddr_t addr = 0;
    if (H5Oget_info_by_name3(f, name, &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0 ||
        H5VLnative_token_to_addr(f, info.token, &addr) < 0) {
#else
    H5O_info_t info;
    if (H5Oget_info_by_name2(f, name, &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) {
#endif
        fprintf(stderr, "state_check: no object %s in %s\n", name, path);
        return 1;
    }
#if !H5_VERSION_GE(1, 12, 0)
    haddr_t addr = info.addr;
#endif
    printf("%llu\n", (unsigned long long)addr);
    H5Fclose(f);
    return 0;
}

static hid_t open_rw(const char *path) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) {
        fprintf(stderr, "state_check: cannot open %s for writing\n", path);
        exit(1);
    }
    return f;
}

static int unlink_dataset(const char *path, const char *name) {
    hid_t f = open_rw(path);
    int bad = H5Ldelete(f, name, H5P_DEFAULT) < 0;
    if (bad) fprintf(stderr, "state_check: cannot delete %s from %s\n", name, path);
    return (H5Fclose(f) < 0) | bad;
}

static int write_nan(const char *path, const char *name) {
    hid_t f = open_rw(path);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    hid_t space = d < 0 ? -1 : H5Dget_space(d);
    hsize_t start[2] = {0, 0}, one[2] = {1, 1};
    hid_t mem = H5Screate_simple(1, one, NULL);
    float nan = NAN;
    int bad = space < 0 || H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, one, NULL) < 0 ||
              H5Dwrite(d, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, &nan) < 0;
    if (bad) fprintf(stderr, "state_check: cannot write %s in %s\n", name, path);
    H5Sclose(mem);
    if (space >= 0) H5Sclose(space);
    if (d >= 0) H5Dclose(d);
    return (H5Fclose(f) < 0) | bad;
}

/* Deletes the lineage attributes (run_id, branch, branch_parents) from the root of FILE: a state file
 * as gtrain wrote them before they existed. */
static int strip_lineage(const char *path) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) {
        fprintf(stderr, "state_check: cannot open %s for writing\n", path);
        return 1;
    }
    const char *names[3] = {"run_id", "branch", "branch_parents"};
    int rc = 0;
    for (int i = 0; i < 3; i++)
        if (H5Aexists(f, names[i]) > 0 && H5Adelete(f, names[i]) < 0) rc = 1;
    if (H5Fclose(f) < 0) rc = 1;
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "verify") == 0) return verify(argv[2]);
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "compare") == 0)
        return compare(argv[2], argv[3], argc == 5 ? atof(argv[4]) : -1.0);
    if (argc == 4 && strcmp(argv[1], "chunk") == 0) return chunk(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "header") == 0) return header(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "unlink") == 0) return unlink_dataset(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "nan") == 0) return write_nan(argv[2], argv[3]);
    if (argc == 3 && strcmp(argv[1], "strip-lineage") == 0) return strip_lineage(argv[2]);
    fprintf(stderr, "usage: state_check verify FILE | compare A B [RTOL] | chunk FILE DATASET | header FILE DATASET | "
            "unlink FILE DATASET | nan FILE DATASET | strip-lineage FILE\n");
    return 2;
}
