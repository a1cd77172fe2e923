/*
 * Immediate counters. Lifecycle of one immediate value:
 *   (absent) --arrival--> EARLY --expect--> EXPECTING --count reached--> RETIRED (event fired)
 *   (absent) --expect--> EXPECTING;  EARLY/EXPECTING --cancel--> RETIRED (no event)
 * Arrivals for a RETIRED value are late or duplicate: counted in stats.imm_late and dropped.
 * expect() on a RETIRED value starts a new incarnation (immediates are reused after wrap-around).
 * Retired entries are remembered for the latest FAB_MAX_RETIRED retirements, then forgotten.
 * Every function here runs with eng->lock held.
 */
#include <stdlib.h>

#include "fab_internal.h"

enum { FAB_IMM_EARLY = 1, FAB_IMM_EXPECTING = 2, FAB_IMM_RETIRED = 3 };

static struct fab_imm_entry **slot_of(struct fab_imm_table *t, uint32_t imm)
{
    /* Fibonacci hashing: request ids are often sequential */
    uint32_t b = (uint32_t)((imm * 2654435761u) >> 20) & (FAB_IMM_BUCKETS - 1);
    struct fab_imm_entry **p = &t->buckets[b];
    while (*p && (*p)->imm != imm)
        p = &(*p)->next;
    return p;
}

static struct fab_imm_entry *create(struct fab_imm_table *t, struct fab_imm_entry **slot,
                                    uint32_t imm, int state)
{
    (void)t;
    struct fab_imm_entry *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->imm = imm;
    e->state = state;
    *slot = e;
    return e;
}

/* Forget the older half of the retired entries once there are too many. */
static void prune(struct fab_imm_table *t)
{
    if (t->num_retired <= FAB_MAX_RETIRED)
        return;
    uint64_t keep_from = t->retire_seq - FAB_MAX_RETIRED / 2;
    for (uint32_t b = 0; b < FAB_IMM_BUCKETS; b++) {
        struct fab_imm_entry **p = &t->buckets[b];
        while (*p) {
            struct fab_imm_entry *e = *p;
            if (e->state == FAB_IMM_RETIRED && e->retired_seq < keep_from) {
                *p = e->next;
                free(e);
                t->num_retired--;
            } else {
                p = &e->next;
            }
        }
    }
}

static void retire(struct fab_engine *eng, struct fab_imm_entry *e)
{
    e->state = FAB_IMM_RETIRED;
    e->retired_seq = ++eng->imms.retire_seq;
    eng->imms.num_retired++;
    prune(&eng->imms);
}

static void fire(struct fab_engine *eng, struct fab_imm_entry *e)
{
    if (e->received > e->expected)
        eng->stats.imm_late += e->received - e->expected;
    uint32_t imm = e->imm;
    retire(eng, e); /* may free e */
    fab_events_push(&eng->events, FAB_EV_IMM_DONE, 0, imm, NULL, 0);
}

void fab_imm_add(struct fab_engine *eng, uint32_t imm, uint64_t weight)
{
    struct fab_imm_entry **slot = slot_of(&eng->imms, imm);
    struct fab_imm_entry *e = *slot;
    eng->stats.imm_received += weight;
    if (!e) {
        e = create(&eng->imms, slot, imm, FAB_IMM_EARLY);
        if (!e) {
            eng->stats.imm_late += weight; /* out of memory: dropped, and visible */
            return;
        }
    }
    switch (e->state) {
    case FAB_IMM_EARLY:
        e->received += weight;
        eng->stats.imm_early += weight;
        break;
    case FAB_IMM_EXPECTING:
        e->received += weight;
        if (e->received >= e->expected)
            fire(eng, e);
        break;
    default:
        eng->stats.imm_late += weight;
    }
}

int fab_imm_expect(struct fab_engine *eng, uint32_t imm, uint64_t count)
{
    struct fab_imm_entry **slot = slot_of(&eng->imms, imm);
    struct fab_imm_entry *e = *slot;
    if (!e) {
        e = create(&eng->imms, slot, imm, FAB_IMM_EXPECTING);
        if (!e)
            return -FI_ENOMEM;
    } else if (e->state == FAB_IMM_EXPECTING) {
        fab_set_error("immediate %u is already expected; cancel it first or use a fresh one", imm);
        return -FI_EALREADY;
    } else if (e->state == FAB_IMM_RETIRED) {
        e->received = 0;
        eng->imms.num_retired--;
    }
    e->state = FAB_IMM_EXPECTING;
    e->expected = count;
    if (e->received >= e->expected)
        fire(eng, e);
    return 0;
}

void fab_imm_cancel(struct fab_engine *eng, uint32_t imm)
{
    struct fab_imm_entry **slot = slot_of(&eng->imms, imm);
    struct fab_imm_entry *e = *slot;
    if (!e)
        e = create(&eng->imms, slot, imm, FAB_IMM_RETIRED);
    if (!e)
        return;
    if (e->state == FAB_IMM_RETIRED && e->retired_seq != 0)
        return;
    retire(eng, e);
}

void fab_imm_destroy(struct fab_imm_table *t)
{
    for (uint32_t b = 0; b < FAB_IMM_BUCKETS; b++) {
        struct fab_imm_entry *e = t->buckets[b];
        while (e) {
            struct fab_imm_entry *next = e->next;
            free(e);
            e = next;
        }
        t->buckets[b] = NULL;
    }
}
