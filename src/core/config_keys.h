/*
 * config_keys.h — the key types of config.c's key table: how a key of each type is read from text,
 * written back as the INI spells it, described in an error's "(expected ...)", and how many bytes
 * its field in gt_config takes. config.c holds the table itself (one key_spec per key) and the
 * parsing of files and overrides around it.
 */
#ifndef GT_CONFIG_KEYS_H
#define GT_CONFIG_KEYS_H

#include <stddef.h>

typedef enum key_type {
    KEY_INT,     /* int in [min, max] */
    KEY_INT_AUTO,/* int in [min, max], or auto (stored as GT_KEY_INT_AUTO) */
    KEY_FLOAT,   /* float, range below */
    KEY_DOUBLE,  /* double, range below */
    KEY_DOUBLE_AUTO, /* double in the range below, or auto (stored as GT_KEY_DOUBLE_AUTO) */
    KEY_U64,     /* uint64_t, any value (seed) */
    KEY_BYTES,   /* uint64_t byte size through gt_parse_bytes */
    KEY_ENUM,    /* an enum field (stored as int), one of `names` (config.c's name tables) */
    KEY_PATH,    /* free text; `min` = 1 means it must not be empty */
    KEY_POLICY,  /* memory.recompute: checked with gt_policy_parse once n_layers is known */
    KEY_RESUME,  /* auto | never | PATH */
    KEY_BOOL,    /* int 0 or 1, written true | false */
    } key_type;

#define GT_KEY_INT_AUTO (-1) /* KEY_INT_AUTO's auto: config.h's GT_INT_AUTO (config.c checks they agree) */
#define GT_KEY_DOUBLE_AUTO (-1.0) /* KEY_DOUBLE_AUTO's auto: config.h's GT_DOUBLE_AUTO (the ranges exclude it) */

/* Range flags for numbers. */
#define MIN_OPEN 1 /* min is excluded: x > min */
#define MAX_OPEN 2 /* max is excluded: x < max */

typedef struct key_spec {
    const char *section;
    const char *name;
    key_type type;
    size_t offset;       /* into gt_config */
    size_t size;         /* of the string field, for text keys */
    double min, max;     /* numbers: the range; INFINITY = unbounded */
    int flags;
    const char *const *names; /* KEY_ENUM: the name of each value, NULL-terminated */
    int changes_model;   /* FN or RUN (config.c) */
} key_spec;

/* Sets a key's field from text: 0, or -1 with why = what is wrong and what was expected
 * ("'x' is not an integer (expected an integer in 1..1024)"; the caller puts where in front). */
int gt_key_set(const key_spec *ks, void *field, const char *value, char *why, size_t why_len);

/* The field's value as the INI spells it (what gt_config_to_ini writes; gt_key_set reads it back). */
void gt_key_write(const key_spec *ks, const void *field, char *out, size_t len);

/* What the key accepts, for "(expected ...)". */
void gt_key_expected(const key_spec *ks, char *out, size_t len);

/* Bytes of the key's field in gt_config. */
size_t gt_key_field_size(const key_spec *ks);

/* A number key: whether v is within the key's range. */
int gt_key_in_range(const key_spec *ks, double v);

#endif
