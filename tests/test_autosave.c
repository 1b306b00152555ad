/*
 * test_autosave.c — checkpoint.every = auto's arithmetic (src/core/autosave.c) on hand-worked numbers:
 * Young's interval and Daly's bound, the interval in steps, the history record of a lineage (faults,
 * observed time, the last cost; another lineage's record and a torn line are not used), the MTBF from
 * the prior and the history, and the key itself (auto, numbers, bad values, the INI round trip); and
 * checkpoint.memory_every = auto's choice through the same code: its prior cost from the slot's
 * bytes, the interval from the step time, a measured refresh that moves it, Daly's bound, the
 * refresh kept out of the step time, a file save restarting its count, its history lines.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autosave.h"
#include "check.h"
#include "config.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (fabs(b) > 1 ? fabs(b) : 1); }

static void interval(void) {
    /* sqrt(2 x 2 s x 3600 s) = sqrt(14400) = 120 s */
    CHECK(near(gt_autosave_seconds(2, 3600), 120), "%g", gt_autosave_seconds(2, 3600));
    /* sqrt(2 x 0.5 s x 14400 s) = 120 s: a quarter of the cost at four times the MTBF */
    CHECK(near(gt_autosave_seconds(0.5, 14400), 120), "%g", gt_autosave_seconds(0.5, 14400));
    /* sqrt(2 x 8 s x 100 s) = 40 s */
    CHECK(near(gt_autosave_seconds(8, 100), 40), "%g", gt_autosave_seconds(8, 100));
    /* Daly's bound: a save costs 2 x M or more: one save per M */
    CHECK(near(gt_autosave_seconds(10, 5), 5), "%g", gt_autosave_seconds(10, 5));
    CHECK(near(gt_autosave_seconds(30, 5), 5), "%g", gt_autosave_seconds(30, 5));
    /* just under the bound: sqrt(2 x 9.9 x 5) = sqrt(99) */
    CHECK(near(gt_autosave_seconds(9.9, 5), sqrt(99)), "%g", gt_autosave_seconds(9.9, 5));

    /* steps: 120 s at 3 s a step = 40; at 7 s = 17.14 -> 17; at 80 s = 1.5 -> 2 (nearest); at 300 s:
     * 0.4 -> at least 1; no step time: 1 */
    CHECK(gt_autosave_steps(120, 3) == 40, "%d", gt_autosave_steps(120, 3));
    CHECK(gt_autosave_steps(120, 7) == 17, "%d", gt_autosave_steps(120, 7));
    CHECK(gt_autosave_steps(120, 80) == 2, "%d", gt_autosave_steps(120, 80));
    CHECK(gt_autosave_steps(120, 300) == 1, "%d", gt_autosave_steps(120, 300));
    CHECK(gt_autosave_steps(120, 0) == 1, "%d", gt_autosave_steps(120, 0));
}

static void history(void) {
    /* three earlier starts: the first killed after its save at t = 1200 (a fault: it spans to the next
     * start, 1000..1300: 300 s), the second ended cleanly (1300..1500: 200 s), the third killed before
     * any whole line after its start (a fault; 0 s so far, its span runs to the start that reads the
     * record): 2 faults in 500 s; the newest cost 3.0 s */
    const char *text = "gtrain-history 1 abc123\n"
                       "start 1000.0 0\n"
                       "save 1100.0 10 2.0\n"
                       "save 1200.0 20 2.5\n"
                       "start 1300.0 20\n"
                       "save 1400.0 30 3.0\n"
                       "end 1500.0 40\n"
                       "start 1600.0 40\n"
                       "save 1650.5 4"; /* torn by a kill: no newline, skipped */
    gt_save_history h;
    gt_autosave_parse_history(text, "abc123", &h);
    CHECK(h.starts == 3, "%d", h.starts);
    CHECK(h.faults == 2, "%d", h.faults);
    CHECK(near(h.observed_s, 500), "%g", h.observed_s);
    CHECK(near(h.last_cost_s, 3.0), "%g", h.last_cost_s);
    CHECK(near(h.unended_last_s, 1600), "%g", h.unended_last_s);
    /* the start reading it began at 1700: the third start spans 1600..1700 */
    gt_autosave_history_until(&h, 1700);
    CHECK(near(h.observed_s, 600) && h.unended_last_s == 0, "%g %g", h.observed_s, h.unended_last_s);

    char why[200];
    /* 2 faults in 600 s + the current start's 200 s: M = 800 / 2 = 400 s */
    CHECK(near(gt_autosave_mtbf(14400, &h, 200, 0, why, sizeof why), 400), "%s", why);
    CHECK(strstr(why, "2 faults") != NULL, "%s", why);

    /* a start that resumed from memory snapshots says so: the fault before it needed no state file, so
     * the files' interval (files_only, while snapshots are taken) counts 1 fault in 800 s, the
     * snapshots' both (400 s) */
    gt_autosave_parse_history("gtrain-history 1 abc123\nstart 1000.0 0\nsave 1100.0 10 2.0\nstart 1300.0 10 memory\n"
                              "end 1500.0 40\nstart 1600.0 40\n", "abc123", &h);
    CHECK(h.faults == 2 && h.memory_faults == 1, "%d %d", h.faults, h.memory_faults);
    gt_autosave_history_until(&h, 1700);
    CHECK(near(gt_autosave_mtbf(14400, &h, 200, 1, why, sizeof why), 800), "%s", why);
    CHECK(strstr(why, "1 fault in") && strstr(why, "besides 1 resumed from memory snapshots"), "%s", why);
    CHECK(near(gt_autosave_mtbf(14400, &h, 200, 0, why, sizeof why), 400), "%s", why);

    /* another lineage's record (its first line names it): nothing of it is used */
    gt_autosave_parse_history(text, "other9", &h);
    CHECK(h.starts == 0 && h.faults == 0 && h.observed_s == 0 && h.last_cost_s < 0, "%d %d %g %g", h.starts,
          h.faults, h.observed_s, h.last_cost_s);
    CHECK(near(gt_autosave_mtbf(14400, &h, 200, 0, why, sizeof why), 14400), "%s", why);
    CHECK(strstr(why, "prior") != NULL, "%s", why);
    /* no header at all: not used either */
    gt_autosave_parse_history("start 1000.0 0\nstart 1100.0 0\n", "abc123", &h);
    CHECK(h.starts == 0 && h.faults == 0, "%d %d", h.starts, h.faults);

    /* no fault: the prior while the observed time is shorter, the observed time once it is longer */
    gt_autosave_parse_history("gtrain-history 1 abc123\nstart 0 0\nend 100 10\n", "abc123", &h);
    CHECK(h.starts == 1 && h.faults == 0 && near(h.observed_s, 100) && h.last_cost_s < 0, "%d %d %g", h.starts,
          h.faults, h.observed_s);
    CHECK(near(gt_autosave_mtbf(3600, &h, 50, 0, why, sizeof why), 3600), "%s", why);
    CHECK(near(gt_autosave_mtbf(3600, &h, 5000, 0, why, sizeof why), 5100), "%s", why);
}

static int near_rel(double a, double b, double rel) { return fabs(a - b) <= rel * fabs(b); }

static void memory_every_auto(void) {
    char dir[] = "/tmp/test_autosave_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    gt_autosave a;
    /* rank 0, memory_every = auto only; MTBF prior 0.5 h = 1800 s; a slot of 0.05 GiB: the prior cost
     * 0.05 GiB at 1 GiB/s = 0.05 s */
    gt_autosave_begin(&a, 1, dir, "abc123", 0.5, 0, 1e9, 1, 0.05 * (double)(1u << 30), 0, 0, 0);
    CHECK(a.on && a.snap.on && !a.save.on, "%d %d %d", a.on, a.snap.on, a.save.on);
    CHECK(near(a.snap.prior_cost_s, 0.05), "%g", a.snap.prior_cost_s);
    CHECK(!gt_autosave_due(&a, 100), "checkpoint.every is not auto here");
    /* step 1 (the warm-up, 1.5 s by its own time), step 2 by the period: 10.5 - 10.0 = 0.5 s */
    gt_autosave_step(&a, 1, 10.0, 1.5);
    CHECK(!gt_autosave_snap_due(&a, 1) && a.snap.every == 0, "no choice before a step past the warm-up");
    gt_autosave_step(&a, 0, 10.5, 0.4);
    /* sqrt(2 x 0.05 s x 1800 s) = sqrt(180) = 13.416 s; / 0.5 s = 26.8 -> 27 steps */
    CHECK(!gt_autosave_snap_due(&a, 2) && a.snap.every == 27, "%d", a.snap.every);
    CHECK(!gt_autosave_snap_due(&a, 26) && gt_autosave_snap_due(&a, 27), "due at step 27, counted from the start");
    /* the refresh of step 27 blocked 0.2 s: the measured cost, sqrt(2 x 0.2 x 1800) = sqrt(720) = 26.83 s,
     * / 0.5 s = 53.7 -> 54 steps (moved by more than a quarter: the new interval) */
    gt_autosave_snapped(&a, 27, 0.2);
    CHECK(a.snap.every == 54 && a.snap.since == 27, "%d %d", a.snap.every, a.snap.since);
    CHECK(!gt_autosave_snap_due(&a, 80) && gt_autosave_snap_due(&a, 81), "due 54 steps after step 27");
    /* the refresh is not the next step's time: a period of 0.7 s less its 0.2 s is a step of 0.5 s */
    gt_autosave_step(&a, 0, 11.2, 0.4);
    CHECK(a.steps == 2 && near(a.step_sum_s / a.steps, 0.5), "%d %g", a.steps, a.step_sum_s / a.steps);
    /* a second refresh of 0.25 s: the mean 0.225 s, sqrt(2 x 0.225 x 1800) = sqrt(810) = 28.46 s -> 57
     * steps, less than a quarter from 54: kept */
    gt_autosave_snapped(&a, 81, 0.25);
    CHECK(a.snap.every == 54 && a.snap.costs == 2 && near(a.snap.cost_sum_s, 0.45), "%d %d", a.snap.every, a.snap.costs);
    /* a state file saved at step 100 restarts the count */
    gt_autosave_after_saves(&a, 100, 0.01, 0, 100, 0, 100);
    CHECK(a.snap.since == 100 && !gt_autosave_snap_due(&a, 153) && gt_autosave_snap_due(&a, 154), "%d", a.snap.since);
    gt_autosave_end(&a, 200);
    /* the history: its header, the start, one snap line (the first refresh; the next within the minute
     * is not written), the end */
    char path[4300], text[1024] = "";
    snprintf(path, sizeof path, "%s/.gtrain-history-abc123", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "%s", path);
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = '\0';
    if (f) fclose(f);
    CHECK(strncmp(text, "gtrain-history 1 abc123\nstart ", 30) == 0 && strstr(text, "\nsnap ") &&
          strstr(text, " 27 0.200000\n") && !strstr(text, " 81 0.250000") && strstr(text, "\nend "), "%s", text);
    /* the next start reads the snap line: its prior cost is the last measured refresh */
    gt_save_history h;
    gt_autosave_parse_history(text, "abc123", &h);
    CHECK(near(h.last_snap_cost_s, 0.2) && h.last_cost_s < 0 && h.faults == 0, "%g %g", h.last_snap_cost_s, h.last_cost_s);
    gt_autosave_begin(&a, 1, dir, "abc123", 0.5, 0, 1e9, 1, 0.05 * (double)(1u << 30), 200, 0, 0);
    CHECK(near(a.snap.prior_cost_s, 0.2) && a.snap.from_history && a.snap.since == 200, "%g", a.snap.prior_cost_s);
    /* that start dies; the next resumes from memory snapshots: the fault is one of them, its line says so */
    gt_autosave_begin(&a, 1, dir, "abc123", 0.5, 1, 1e9, 1, 0.05 * (double)(1u << 30), 200, 1, 1);
    CHECK(a.history.faults == 1 && a.history.memory_faults == 1 && a.snapshots, "%d %d", a.history.faults,
          a.history.memory_faults);
    f = fopen(path, "r");
    n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = '\0';
    if (f) fclose(f);
    CHECK(n > 8 && strcmp(text + n - 8, " memory\n") == 0, "%s", text);
    unlink(path);

    /* Daly's bound: a slot of 4000 GiB, a prior of 4000 s >= 2 x 1800 s: one snapshot per MTBF, 1800 s
     * / 0.5 s = 3600 steps */
    gt_autosave_begin(&a, 1, dir, "def456", 0.5, 0, 1e9, 1, 4000.0 * (double)(1u << 30), 0, 0, 0);
    gt_autosave_step(&a, 1, 10.0, 1.5);
    gt_autosave_step(&a, 0, 10.5, 0.4);
    CHECK(!gt_autosave_snap_due(&a, 2) && a.snap.every == 3600, "%d", a.snap.every);
    snprintf(path, sizeof path, "%s/.gtrain-history-def456", dir);
    unlink(path);
    /* not rank 0, or neither key auto: off, no history */
    gt_autosave_begin(&a, 0, dir, "ghi789", 0.5, 1, 1e9, 1, 1e6, 0, 0, 0);
    CHECK(!a.on && !gt_autosave_snap_due(&a, 1000), "off on other ranks");
    gt_autosave_begin(&a, 1, dir, "ghi789", 0.5, 0, 1e9, 0, 1e6, 0, 0, 0);
    CHECK(!a.on, "off without auto");
    snprintf(path, sizeof path, "%s/.gtrain-history-ghi789", dir);
    CHECK(access(path, F_OK) != 0, "no history written when off");
    /* the prior at 1 GiB/s as stated; the default of the key is auto */
    CHECK(near_rel(GT_AUTOSAVE_REFRESH_BYTES_PER_S, 1073741824.0, 1e-12), "%g", GT_AUTOSAVE_REFRESH_BYTES_PER_S);
    gt_config def;
    gt_config_defaults(&def);
    CHECK(def.checkpoint.memory_every == GT_INT_AUTO, "%d", def.checkpoint.memory_every);
    rmdir(dir);
}

/* checkpoint.memory_share: refreshes at least every cost / share seconds when that is sooner than
 * Young's interval; the state files' interval never by the share */
static void memory_share(void) {
    char dir[] = "/tmp/test_autosave_share_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    gt_autosave a;
    char path[4300];
    /* both keys auto; MTBF prior 0.5 h = 1800 s; a slot of 0.05 GiB (prior cost 0.05 s), a state file
     * of 2^30 bytes (prior cost 1 s); share 0.01 */
    gt_autosave_begin(&a, 1, dir, "sha001", 0.5, 1, (double)(1u << 30), 1, 0.05 * (double)(1u << 30), 0, 0, 0);
    a.snap.share = 0.01;
    gt_autosave_step(&a, 1, 10.0, 1.5);
    gt_autosave_step(&a, 0, 10.5, 0.4);
    /* 0.05 s / 0.01 = 5 s, sooner than Young's sqrt(2 x 0.05 x 1800) = 13.4 s: 5 / 0.5 = 10 steps */
    CHECK(!gt_autosave_snap_due(&a, 2) && a.snap.every == 10, "%d", a.snap.every);
    CHECK(!gt_autosave_snap_due(&a, 9) && gt_autosave_snap_due(&a, 10), "due at step 10");
    /* the files keep Young's: sqrt(2 x 1 x 1800) = 60 s / 0.5 s = 120 steps */
    CHECK(!gt_autosave_due(&a, 2) && a.save.every == 120, "%d", a.save.every);
    /* a measured refresh of 0.2 s: 20 s by the share (Young's 26.8 s): 40 steps, said as moved */
    gt_autosave_snapped(&a, 10, 0.2);
    CHECK(a.snap.every == 40, "%d", a.snap.every);
    snprintf(path, sizeof path, "%s/.gtrain-history-sha001", dir);
    unlink(path);
    /* a short prior, 0.01 h = 36 s: Young's sqrt(2 x 0.05 x 36) = 1.90 s is sooner than the share's 5 s:
     * 1.90 / 0.5 = 3.8 -> 4 steps */
    gt_autosave_begin(&a, 1, dir, "sha002", 0.01, 0, 1e9, 1, 0.05 * (double)(1u << 30), 0, 0, 0);
    a.snap.share = 0.01;
    gt_autosave_step(&a, 1, 10.0, 1.5);
    gt_autosave_step(&a, 0, 10.5, 0.4);
    CHECK(!gt_autosave_snap_due(&a, 2) && a.snap.every == 4, "%d", a.snap.every);
    snprintf(path, sizeof path, "%s/.gtrain-history-sha002", dir);
    unlink(path);
    /* share 0: Young's alone (27 steps, as in memory_every_auto) */
    gt_autosave_begin(&a, 1, dir, "sha003", 0.5, 0, 1e9, 1, 0.05 * (double)(1u << 30), 0, 0, 0);
    gt_autosave_step(&a, 1, 10.0, 1.5);
    gt_autosave_step(&a, 0, 10.5, 0.4);
    CHECK(!gt_autosave_snap_due(&a, 2) && a.snap.every == 27, "%d", a.snap.every);
    snprintf(path, sizeof path, "%s/.gtrain-history-sha003", dir);
    unlink(path);
    gt_config def;
    gt_config_defaults(&def);
    CHECK(def.checkpoint.memory_share == 0.01, "%g", def.checkpoint.memory_share);
    rmdir(dir);
}

static void key(void) {
    char err[512];
    gt_config c;
    char *ov[] = {"checkpoint.every=auto", "checkpoint.mtbf=0.5"};
    CHECK(gt_config_load(&c, NULL, 2, ov, err, sizeof err) == 0, "%s", err);
    CHECK(c.checkpoint.every == GT_INT_AUTO && c.checkpoint.mtbf == 0.5, "%d %g", c.checkpoint.every, c.checkpoint.mtbf);
    char *ini = gt_config_to_ini(&c);
    CHECK(strstr(ini, "every = auto\n") != NULL, "%s", ini);
    gt_config back;
    CHECK(gt_config_load_string(&back, ini, "round-trip", 0, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(back.checkpoint.every == GT_INT_AUTO, "%d", back.checkpoint.every);
    free(ini);
    /* numbers are what they were */
    char *num[] = {"checkpoint.every=7"};
    CHECK(gt_config_load(&c, NULL, 1, num, err, sizeof err) == 0 && c.checkpoint.every == 7, "%s", err);
    gt_config def;
    gt_config_defaults(&def);
    CHECK(def.checkpoint.every == 0 && def.checkpoint.mtbf == 4, "%d %g", def.checkpoint.every, def.checkpoint.mtbf);
    /* bad values: exit 2 with the key and what was expected */
    const char *bad[][2] = {
        {"checkpoint.every=sometimes", "'sometimes' is neither auto nor an integer (expected auto or an integer >= 0)"},
        {"checkpoint.every=-1", "-1 is out of range (expected auto or an integer >= 0)"},
        {"checkpoint.every=Auto", "'Auto' is neither auto nor an integer"},
        {"checkpoint.mtbf=0", "0 is out of range (expected a number > 0)"},
        {"checkpoint.mtbf=-2", "-2 is out of range"},
        {"checkpoint.mtbf=auto", "'auto' is not a number"},
        {"checkpoint.memory_share=1", "1 is out of range (expected a number in [0, 1))"},
        {"checkpoint.memory_share=-0.1", "-0.1 is out of range"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *o[] = {(char *)bad[i][0]};
        int rc = gt_config_load(&c, NULL, 1, o, err, sizeof err);
        CHECK(rc == 2 && strstr(err, bad[i][0]) && strstr(err, bad[i][1]), "%s: rc %d: %s", bad[i][0], rc, err);
    }
}

int main(void) {
    interval();
    history();
    memory_every_auto();
    memory_share();
    key();
    if (check_failures) fprintf(stderr, "%d check(s) failed\n", check_failures);
    else printf("PASS\n");
    return check_failures ? 1 : 0;
}
