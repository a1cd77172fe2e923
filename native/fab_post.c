/*
 * Posting, on the progress thread: hands queued writes (after same-host direct copies) and
 * control messages to the provider until it pushes back. Completions are fab_progress.c's.
 */
#include <stdlib.h>
#include <string.h>

#include "fab_internal.h"

void fab_free_batch(struct fab_batch *b)
{
    free(b->ops);
    free(b->writes);
    free(b);
}

void fab_finish_batch(struct fab_engine *eng, struct fab_batch *b)
{
    if (b->inflight_prev)
        b->inflight_prev->inflight_next = b->inflight_next;
    else if (eng->inflight_head == b)
        eng->inflight_head = b->inflight_next;
    if (b->inflight_next)
        b->inflight_next->inflight_prev = b->inflight_prev;
    pthread_mutex_lock(&eng->lock);
    eng->mrs[b->src_handle - 1].inflight_batches--;
    pthread_mutex_unlock(&eng->lock);
    fab_events_push(&eng->events, FAB_EV_BATCH_DONE, b->status, b->id, NULL, 0);
    fab_free_batch(b);
}

static int peer_in(const fi_addr_t *peers, int n, fi_addr_t peer)
{
    for (int i = 0; i < n; i++)
        if (peers[i] == peer)
            return 1;
    return 0;
}

/* A direct batch, the first time the progress thread sees it: copy every write into the mapped
 * target region, then turn the writes into signals -- one zero-length write per run of one
 * immediate, carrying the run's entry count -- so the target counts exactly as for real writes.
 * The signals are posted after the copies, and shm's queue hand-off orders them after the data. */
static void copy_direct(struct fab_engine *eng, struct fab_batch *b)
{
    uint64_t m = 0, entries = 0;
    for (uint64_t i = 0; i < b->num_writes; i++) {
        struct fab_write w = b->writes[i];
        memcpy(b->direct + w.dst_off, b->src_ptr + w.src_off, w.len);
        uint64_t count = w.data >> 32;
        entries += count;
        struct fab_write *run = m ? &b->writes[m - 1] : NULL;
        if (run && (uint32_t)run->data == (uint32_t)w.data &&
            (run->data >> 32) + count <= 0xffffffffull) {
            run->data += count << 32;
            continue;
        }
        b->writes[m++] = (struct fab_write){w.src_off, w.dst_off, 0, w.data};
    }
    b->num_writes = m;
    b->direct = NULL; /* copied: from here on an ordinary batch of signals */
    __atomic_add_fetch(&eng->stats.writes_direct, entries, __ATOMIC_RELAXED);
}

/* Posts what it can; returns how many writes went out. A peer whose write got -FI_EAGAIN is
 * skipped for the rest of the round (its later batches keep their order), so one stuck peer,
 * e.g. a dead shm process whose queue never drains, cannot hold back writes to the others. */
static uint64_t post_writes(struct fab_engine *eng)
{
    uint64_t posted = 0;
    fi_addr_t blocked[FAB_MAX_BLOCKED_PEERS];
    int num_blocked = 0;
    struct fab_batch *prev = NULL, **link = &eng->post_head;
    while (*link) {
        struct fab_batch *b = *link;
        int again = peer_in(blocked, num_blocked, b->peer);
        if (b->direct && !again)
            copy_direct(eng, b);
        while (!again && b->num_posted < b->num_writes && b->status == 0) {
            struct fab_write *w = &b->writes[b->num_posted];
            struct fab_op *op = &b->ops[b->num_posted];
            op->magic = FAB_OP_MAGIC;
            op->kind = FAB_OP_WRITE;
            op->batch = b;
            __atomic_store_n(&eng->posting_to, b->peer + 1, __ATOMIC_RELAXED);
            int rc = fi_writedata(eng->ep, b->src_ptr + w->src_off, w->len, b->src_desc, w->data,
                                  b->peer, b->dst.addr_base + w->dst_off, b->dst.key, &op->ctx);
            __atomic_store_n(&eng->posting_to, 0, __ATOMIC_RELAXED);
            if (rc == -FI_EAGAIN) {
                __atomic_add_fetch(&eng->stats.eagain, 1, __ATOMIC_RELAXED); /* read by fab_get_stats */
                if (num_blocked == FAB_MAX_BLOCKED_PEERS)
                    return posted; /* the provider is full everywhere: poll first */
                blocked[num_blocked++] = b->peer;
                again = 1;
                break;
            }
            if (rc) {
                b->status = rc; /* the rest of the batch is not sent */
                break;
            }
            b->num_posted++;
            b->num_outstanding++;
            __atomic_add_fetch(&eng->stats.writes_posted, 1, __ATOMIC_RELAXED);
            posted++;
        }
        if (again) {
            prev = b;
            link = &b->next;
            continue;
        }
        /* fully handed over (or abandoned after an error): unlink */
        *link = b->next;
        if (eng->post_tail == b)
            eng->post_tail = prev;
        b->next = NULL;
        b->num_posted = b->num_writes;
        if (b->num_outstanding == 0) {
            fab_finish_batch(eng, b);
        } else {
            b->inflight_next = eng->inflight_head;
            if (eng->inflight_head)
                eng->inflight_head->inflight_prev = b;
            eng->inflight_head = b;
        }
        posted++; /* a batch handed over counts as progress even when it was empty */
    }
    return posted;
}

/* Posts queued control messages; like writes, a peer that says -FI_EAGAIN is skipped for the
 * round so the others' messages still go (each peer's messages keep their order). */
static uint64_t post_sends(struct fab_engine *eng, struct fab_send **head)
{
    uint64_t handled = 0;
    fi_addr_t blocked[FAB_MAX_BLOCKED_PEERS];
    int num_blocked = 0;
    struct fab_send **link = head;
    while (*link) {
        struct fab_send *s = *link;
        if (peer_in(blocked, num_blocked, s->peer)) {
            link = &s->next;
            continue;
        }
        s->op.magic = FAB_OP_MAGIC;
        s->op.kind = FAB_OP_SEND;
        s->op.send = s;
        void *desc = NULL;
        int rc = 0;
        if ((eng->mr_mode & FI_MR_LOCAL) && !s->mr) {
            rc = fi_mr_reg(eng->domain, s->buf, s->len ? s->len : 1, FI_SEND, 0,
                           __atomic_fetch_add(&eng->next_key, 1, __ATOMIC_RELAXED), 0, &s->mr,
                           NULL);
        }
        if (!rc && s->mr)
            desc = fi_mr_desc(s->mr);
        if (!rc) {
            __atomic_store_n(&eng->posting_to, s->peer + 1, __ATOMIC_RELAXED);
            rc = fi_send(eng->ep, s->buf, s->len, desc, s->peer, &s->op.ctx);
            __atomic_store_n(&eng->posting_to, 0, __ATOMIC_RELAXED);
        }
        if (rc == -FI_EAGAIN) {
            if (num_blocked == FAB_MAX_BLOCKED_PEERS)
                return handled;
            blocked[num_blocked++] = s->peer;
            link = &s->next;
            continue;
        }
        *link = s->next;
        handled++;
        if (rc) {
            fab_events_push(&eng->events, FAB_EV_SEND_DONE, rc, s->id, NULL, 0);
            if (s->mr)
                fi_close(&s->mr->fid);
            free(s);
        }
    }
    return handled;
}

/* Returns how many operations went out: 0 when there was nothing or the provider pushed back. */
uint64_t fab_post_work(struct fab_engine *eng, struct fab_send **sends)
{
    return post_sends(eng, sends) + post_writes(eng);
}
