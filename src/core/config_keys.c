/*
 * config_keys.c — the key types of config.c's table (see config_keys.h): parsing, writing and the
 * expected-values text of each, one row per type in kinds[].
 */
#include "config_keys.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "recompute.h"

/* Whole-string numbers: no trailing text, no empty strings. */
static int parse_long(const char *s, long long *out) {
    if (!*s) return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE) return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out) {
    if (!*s) return -1;
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

static int parse_u64(const char *s, uint64_t *out) {
    if (*s < '0' || *s > '9') return -1; /* strtoull would accept "-1" and wrap it */
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || errno == ERANGE) return -1;
    *out = (uint64_t)v;
    return 0;
}

int gt_key_in_range(const key_spec *ks, double v) {
    if ((ks->flags & MIN_OPEN) ? !(v > ks->min) : !(v >= ks->min)) return 0;
    if ((ks->flags & MAX_OPEN) ? !(v < ks->max) : !(v <= ks->max)) return 0;
    return 1;
}

/* The enum value whose name is `value`, or -1. */
static int enum_value(const char *const *names, const char *value) {
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], value) == 0) return i;
    return -1;
}

/* "(expected an integer in 1..1024)" and friends. */
static void expect_int(const key_spec *ks, char *out, size_t len) {
    if (ks->max >= INT_MAX) snprintf(out, len, "an integer >= %.0f", ks->min);
    else snprintf(out, len, "an integer in %.0f..%.0f", ks->min, ks->max);
}

static void expect_int_auto(const key_spec *ks, char *out, size_t len) {
    char n[96];
    expect_int(ks, n, sizeof n);
    snprintf(out, len, "auto or %s", n);
}

static void expect_number(const key_spec *ks, char *out, size_t len);

static void expect_double_auto(const key_spec *ks, char *out, size_t len) {
    char n[96];
    expect_number(ks, n, sizeof n);
    snprintf(out, len, "auto or %s", n);
}

static void expect_number(const key_spec *ks, char *out, size_t len) {
    if (isinf(ks->max))
        snprintf(out, len, "a number %s %g", (ks->flags & MIN_OPEN) ? ">" : ">=", ks->min);
    else
        snprintf(out, len, "a number in %c%g, %g%c", (ks->flags & MIN_OPEN) ? '(' : '[', ks->min, ks->max,
                 (ks->flags & MAX_OPEN) ? ')' : ']');
}

static void expect_u64(const key_spec *ks, char *out, size_t len) {
    (void)ks;
    snprintf(out, len, "an integer in 0..18446744073709551615");
}

static void expect_bytes(const key_spec *ks, char *out, size_t len) {
    (void)ks;
    snprintf(out, len, "a size in bytes such as 70GiB, 512MiB, 1.5GB or 123; 0 = unset");
}

static void expect_enum(const key_spec *ks, char *out, size_t len) {
    snprintf(out, len, "one of ");
    for (int i = 0; ks->names[i]; i++) {
        size_t at = strlen(out);
        snprintf(out + at, len - at, "%s%s", i ? ", " : "", ks->names[i]);
    }
}

static void expect_path(const key_spec *ks, char *out, size_t len) {
    snprintf(out, len, ks->min > 0 ? "a file path" : "a path, or nothing for none");
}

static void expect_policy(const key_spec *ks, char *out, size_t len) {
    (void)ks;
    snprintf(out, len, "%s", gt_policy_expected());
}

static void expect_resume(const key_spec *ks, char *out, size_t len) {
    (void)ks;
    snprintf(out, len, "auto, never or the path of a training-state file");
}

static void expect_bool(const key_spec *ks, char *out, size_t len) {
    (void)ks;
    snprintf(out, len, "true or false");
}

/* Setters: the field from text, or a failure `prefix: MESSAGE (expected ...)` and -1. */
static int set_int(const key_spec *ks, void *field, const char *value, const char *expected, char *why,
                   size_t why_len) {
    long long v;
    if (parse_long(value, &v) != 0) {
        snprintf(why, why_len, "'%s' is not an integer (expected %s)", value, expected);
        return -1;
    }
    if (!gt_key_in_range(ks, (double)v)) {
        snprintf(why, why_len, "%s is out of range (expected %s)", value, expected);
        return -1;
    }
    *(int *)field = (int)v;
    return 0;
}

static int set_int_auto(const key_spec *ks, void *field, const char *value, const char *expected, char *why,
                        size_t why_len) {
    if (strcmp(value, "auto") == 0) {
        *(int *)field = GT_KEY_INT_AUTO;
        return 0;
    }
    long long v;
    if (parse_long(value, &v) != 0) {
        snprintf(why, why_len, "'%s' is neither auto nor an integer (expected %s)", value, expected);
        return -1;
    }
    return set_int(ks, field, value, expected, why, why_len);
}

static int set_number(const key_spec *ks, void *field, const char *value, const char *expected, char *why,
                      size_t why_len) {
    double v;
    if (parse_double(value, &v) != 0) {
        snprintf(why, why_len, "'%s' is not a number (expected %s)", value, expected);
        return -1;
    }
    /* a float key is checked after rounding to float: 1e-50 would become 0 */
    if (ks->type == KEY_FLOAT) v = (double)(float)v;
    if (!gt_key_in_range(ks, v) || !isfinite(v)) {
        snprintf(why, why_len, "%s is out of range (expected %s)", value, expected);
        return -1;
    }
    if (ks->type == KEY_FLOAT) *(float *)field = (float)v;
    else *(double *)field = v;
    return 0;
}

static int set_double_auto(const key_spec *ks, void *field, const char *value, const char *expected, char *why,
                           size_t why_len) {
    if (strcmp(value, "auto") == 0) {
        *(double *)field = GT_KEY_DOUBLE_AUTO;
        return 0;
    }
    double v;
    if (parse_double(value, &v) != 0) {
        snprintf(why, why_len, "'%s' is neither auto nor a number (expected %s)", value, expected);
        return -1;
    }
    return set_number(ks, field, value, expected, why, why_len);
}

static int set_u64(const key_spec *ks, void *field, const char *value, const char *expected, char *why,
                   size_t why_len) {
    (void)ks;
    if (parse_u64(value, (uint64_t *)field) != 0) {
        snprintf(why, why_len, "'%s' is not an unsigned integer (expected %s)", value, expected);
        return -1;
    }
    return 0;
}

static int set_bytes(const key_spec *ks, void *field, const char *value, const char *expected, char *why,
                     size_t why_len) {
    (void)ks;
    if (gt_parse_bytes(value, (uint64_t *)field) != 0) {
        snprintf(why, why_len, "'%s' is not a size (expected %s)", value, expected);
        return -1;
    }
    return 0;
}

static int set_bool(const key_spec *ks, void *field, const char *value, const char *expected, char *why,
                    size_t why_len) {
    (void)ks;
    if (strcmp(value, "true") != 0 && strcmp(value, "false") != 0) {
        snprintf(why, why_len, "'%s' is not a boolean (expected %s)", value, expected);
        return -1;
    }
    *(int *)field = strcmp(value, "true") == 0;
    return 0;
}

static int set_enum(const key_spec *ks, void *field, const char *value, const char *expected, char *why,
                    size_t why_len) {
    int v = enum_value(ks->names, value);
    if (v < 0) {
        snprintf(why, why_len, "'%s' is not a choice (expected %s)", value, expected);
        return -1;
    }
    *(int *)field = v;
    return 0;
}

static int set_text(const key_spec *ks, void *field, const char *value, const char *expected, char *why,
                    size_t why_len) {
    if (ks->min > 0 && !value[0]) {
        snprintf(why, why_len, "must not be empty (expected %s)", expected);
        return -1;
    }
    if (strlen(value) >= ks->size) {
        snprintf(why, why_len, "'%.40s...' is too long (expected at most %zu characters)", value, ks->size - 1);
        return -1;
    }
    /* The effective config is stored as INI text in every state file and read back on resume:
     * a value must read back as itself. Control characters would not (libinih trims them or
     * ends the line), nor would a ';' or '#' that starts a comment (possible in an override). */
    for (const char *c = value; *c; c++) {
        unsigned char u = (unsigned char)*c;
        if (u < 0x20 || u == 0x7f) {
            snprintf(why, why_len, "the value contains a control character (byte 0x%02x) (expected printable text)", u);
            return -1;
        }
        if ((u == ';' || u == '#') && (c == value || c[-1] == ' ')) {
            snprintf(why, why_len, "'%s': '%c' at the start or after a space begins a comment in a config file (expected "
                 "a value without one)", value, u);
            return -1;
        }
    }
    snprintf(field, ks->size, "%s", value);
    return 0;
}

/* The shortest text that reads back as the same value: 0.1, not 0.10000000000000001. */
static void shortest_number(double v, int is_float, char *out, size_t len) {
    if (v == floor(v) && fabs(v) < 1e15) { /* 10000, not 1e+04 */
        snprintf(out, len, "%.0f", v);
        return;
    }
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(out, len, "%.*g", digits, v);
        double back = strtod(out, NULL);
        if (is_float ? (float)back == (float)v : back == v) return;
    }
}

/* Writers: the value as the INI spells it (what gt_config_to_ini writes and a change names). */
static void write_int(const key_spec *ks, const void *f, char *out, size_t len) {
    (void)ks;
    snprintf(out, len, "%d", *(const int *)f);
}

static void write_int_auto(const key_spec *ks, const void *f, char *out, size_t len) {
    if (*(const int *)f == GT_KEY_INT_AUTO) snprintf(out, len, "auto");
    else write_int(ks, f, out, len);
}

static void write_float(const key_spec *ks, const void *f, char *out, size_t len) {
    (void)ks;
    shortest_number(*(const float *)f, 1, out, len);
}

static void write_double(const key_spec *ks, const void *f, char *out, size_t len) {
    (void)ks;
    shortest_number(*(const double *)f, 0, out, len);
}

static void write_double_auto(const key_spec *ks, const void *f, char *out, size_t len) {
    if (*(const double *)f == GT_KEY_DOUBLE_AUTO) snprintf(out, len, "auto");
    else write_double(ks, f, out, len);
}

static void write_u64(const key_spec *ks, const void *f, char *out, size_t len) {
    (void)ks;
    snprintf(out, len, "%llu", (unsigned long long)*(const uint64_t *)f);
}

static void write_bytes(const key_spec *ks, const void *f, char *out, size_t len) {
    (void)ks;
    gt_format_bytes_exact(*(const uint64_t *)f, out, len);
}

static void write_bool(const key_spec *ks, const void *f, char *out, size_t len) {
    (void)ks;
    snprintf(out, len, "%s", *(const int *)f ? "true" : "false");
}

static void write_enum(const key_spec *ks, const void *f, char *out, size_t len) {
    snprintf(out, len, "%s", ks->names[*(const int *)f]);
}

static void write_text(const key_spec *ks, const void *f, char *out, size_t len) {
    (void)ks;
    snprintf(out, len, "%s", (const char *)f);
}

typedef struct key_kind {
    int (*set)(const key_spec *ks, void *field, const char *value, const char *expected, char *why, size_t why_len);
    void (*write)(const key_spec *ks, const void *field, char *out, size_t len);
    void (*expect)(const key_spec *ks, char *out, size_t len);
    size_t size; /* of the field; 0: a text field, ks->size */
} key_kind;

static const key_kind kinds[] = {
    [KEY_INT] = {set_int, write_int, expect_int, sizeof(int)},
    [KEY_INT_AUTO] = {set_int_auto, write_int_auto, expect_int_auto, sizeof(int)},
    [KEY_FLOAT] = {set_number, write_float, expect_number, sizeof(float)},
    [KEY_DOUBLE] = {set_number, write_double, expect_number, sizeof(double)},
    [KEY_DOUBLE_AUTO] = {set_double_auto, write_double_auto, expect_double_auto, sizeof(double)},
    [KEY_U64] = {set_u64, write_u64, expect_u64, sizeof(uint64_t)},
    [KEY_BYTES] = {set_bytes, write_bytes, expect_bytes, sizeof(uint64_t)},
    [KEY_ENUM] = {set_enum, write_enum, expect_enum, sizeof(int)},
    [KEY_PATH] = {set_text, write_text, expect_path, 0},
    [KEY_POLICY] = {set_text, write_text, expect_policy, 0},
    [KEY_RESUME] = {set_text, write_text, expect_resume, 0},
    [KEY_BOOL] = {set_bool, write_bool, expect_bool, sizeof(int)},
};

void gt_key_expected(const key_spec *ks, char *out, size_t len) { kinds[ks->type].expect(ks, out, len); }

size_t gt_key_field_size(const key_spec *ks) { return kinds[ks->type].size ? kinds[ks->type].size : ks->size; }

void gt_key_write(const key_spec *ks, const void *field, char *out, size_t len) { kinds[ks->type].write(ks, field, out, len); }

int gt_key_set(const key_spec *ks, void *field, const char *value, char *why, size_t why_len) {
    char expected[256];
    gt_key_expected(ks, expected, sizeof expected);
    return kinds[ks->type].set(ks, field, value, expected, why, why_len);
}
