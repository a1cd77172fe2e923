/*
 * The progress thread (callers feed it through fab_submit.c).
 *
 * Callers (Python threads) validate and coalesce a batch, then append it to eng->pending under
 * eng->lock and signal eng->wake. The progress thread moves pending work to its own post list,
 * posts writes until the provider says -FI_EAGAIN (the rest waits for the next round: no caller
 * ever spins), reads the completion queue, and turns completions into events. It never calls
 * into Python. Posting itself is in fab_post.c.
 */
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#include "fab_internal.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* progress thread */

int fab_post_recvs(struct fab_engine *eng)
{
    eng->recv_bufs = calloc(FAB_NUM_RECV_BUFS, FAB_MAX_CONTROL_BYTES);
    if (!eng->recv_bufs)
        return -FI_ENOMEM;
    void *desc = NULL;
    if (eng->mr_mode & FI_MR_LOCAL) {
        int rc = fi_mr_reg(eng->domain, eng->recv_bufs,
                           (size_t)FAB_NUM_RECV_BUFS * FAB_MAX_CONTROL_BYTES, FI_RECV, 0,
                           eng->next_key++, 0, &eng->recv_mr, NULL);
        if (rc)
            return rc;
        desc = fi_mr_desc(eng->recv_mr);
    }
    for (int i = 0; i < FAB_NUM_RECV_BUFS; i++) {
        struct fab_op *op = &eng->recv_ops[i];
        op->magic = FAB_OP_MAGIC;
        op->kind = FAB_OP_RECV;
        op->recv_slot = i;
        int rc = fi_recv(eng->ep, eng->recv_bufs + (size_t)i * FAB_MAX_CONTROL_BYTES,
                         FAB_MAX_CONTROL_BYTES, desc, FI_ADDR_UNSPEC, &op->ctx);
        if (rc)
            return rc;
    }
    return 0;
}

static void repost_recv(struct fab_engine *eng, int slot)
{
    void *desc = eng->recv_mr ? fi_mr_desc(eng->recv_mr) : NULL;
    int rc;
    do {
        rc = fi_recv(eng->ep, eng->recv_bufs + (size_t)slot * FAB_MAX_CONTROL_BYTES,
                     FAB_MAX_CONTROL_BYTES, desc, FI_ADDR_UNSPEC, &eng->recv_ops[slot].ctx);
        if (rc == -FI_EAGAIN)
            fi_cq_read(eng->cq, NULL, 0); /* drive progress so a slot frees up */
    } while (rc == -FI_EAGAIN);
    if (rc)
        fab_events_push(&eng->events, FAB_EV_ERROR, rc, 0, NULL, 0);
}


static void complete_op(struct fab_engine *eng, struct fab_op *op, int status, uint64_t len)
{
    if (op->kind == FAB_OP_WRITE) {
        struct fab_batch *b = op->batch;
        if (status && b->status == 0)
            b->status = status;
        b->num_outstanding--;
        if (b->num_outstanding == 0 && b->num_posted == b->num_writes)
            fab_finish_batch(eng, b);
    } else if (op->kind == FAB_OP_SEND) {
        struct fab_send *s = op->send;
        fab_events_push(&eng->events, FAB_EV_SEND_DONE, status, s->id, NULL, 0);
        if (s->mr)
            fi_close(&s->mr->fid);
        free(s);
    } else if (op->kind == FAB_OP_RECV) {
        if (status == 0) {
            void *copy = malloc(len ? len : 1);
            if (copy) {
                memcpy(copy, eng->recv_bufs + (size_t)op->recv_slot * FAB_MAX_CONTROL_BYTES, len);
                fab_events_push(&eng->events, FAB_EV_RECV, 0, 0, copy, len);
            } else {
                status = -FI_ENOMEM;
            }
        }
        if (status) {
            pthread_mutex_lock(&eng->lock);
            eng->stats.recv_dropped++;
            pthread_mutex_unlock(&eng->lock);
        }
        if (!eng->stop)
            repost_recv(eng, op->recv_slot);
    }
}

static int is_our_op(void *ctx)
{
    return ctx && ((struct fab_op *)ctx)->magic == FAB_OP_MAGIC;
}

/* Reads the CQ once; returns the number of entries handled. */
static int poll_cq(struct fab_engine *eng)
{
    struct fi_cq_data_entry entries[64];
    ssize_t n = fi_cq_read(eng->cq, entries, 64);
    if (n > 0) {
        for (ssize_t i = 0; i < n; i++) {
            struct fi_cq_data_entry *e = &entries[i];
            if (e->flags & FI_REMOTE_CQ_DATA) {
                uint64_t weight = eng->merge_counts ? (e->data >> 32) : 1;
                pthread_mutex_lock(&eng->lock);
                fab_imm_add(eng, (uint32_t)e->data, weight ? weight : 1);
                pthread_mutex_unlock(&eng->lock);
            } else if (is_our_op(e->op_context)) {
                complete_op(eng, e->op_context, 0, e->len);
            }
        }
        return (int)n;
    }
    if (n == -FI_EAVAIL) {
        struct fi_cq_err_entry err = {0};
        if (fi_cq_readerr(eng->cq, &err, 0) > 0) {
            pthread_mutex_lock(&eng->lock);
            eng->stats.cq_errors++;
            pthread_mutex_unlock(&eng->lock);
            int status = -(err.err ? err.err : FI_EOTHER);
            if (!(err.flags & FI_REMOTE_CQ_DATA) && is_our_op(err.op_context))
                complete_op(eng, err.op_context, status, 0);
            else /* a target-side error: not ours to fail a request with, but visible */
                fab_events_push(&eng->events, FAB_EV_ERROR, status, err.prov_errno, NULL, 0);
        }
        return 1;
    }
    return 0;
}

void *fab_progress_main(void *arg)
{
    struct fab_engine *eng = arg;
    struct fab_send *sends = NULL, **sends_tail = &sends;
    uint64_t last_work = now_ns();
    for (;;) {
        __atomic_store_n(&eng->round_started_ns, now_ns(), __ATOMIC_RELAXED);
        pthread_mutex_lock(&eng->lock);
        if (eng->stop) {
            pthread_mutex_unlock(&eng->lock);
            break;
        }
        /* Nap once nothing progressed for a while: no work, or work the provider keeps
         * refusing (a dead shm peer never drains its queue; retrying flat out burns a core). */
        int fresh = eng->pending_head || eng->send_head;
        uint64_t since = now_ns() - last_work;
        if (!fresh && since > FAB_SPIN_NS) {
            long nap_ns = (since > FAB_IDLE_NS ? FAB_IDLE_NAP_US : FAB_SHORT_NAP_US) * 1000L;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += nap_ns;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&eng->wake, &eng->lock, &ts);
        }
        /* take the submitted work; posting happens without the lock */
        if (eng->pending_head) {
            if (eng->post_tail)
                eng->post_tail->next = eng->pending_head;
            else
                eng->post_head = eng->pending_head;
            eng->post_tail = eng->pending_tail;
            eng->pending_head = eng->pending_tail = NULL;
        }
        if (eng->send_head) {
            *sends_tail = eng->send_head;
            eng->send_head = eng->send_tail = NULL;
        }
        pthread_mutex_unlock(&eng->lock);

        uint64_t work = fab_post_work(eng, &sends);
        sends_tail = &sends;
        while (*sends_tail)
            sends_tail = &(*sends_tail)->next;
        int done = 0, n;
        while ((n = poll_cq(eng)) > 0)
            done += n;
        if (work || done)
            last_work = now_ns();
        else
            sched_yield(); /* spinning: let the peer's progress thread (often on this core) run */
    }
    /* sends never posted are reported as cancelled */
    while (sends) {
        struct fab_send *s = sends;
        sends = s->next;
        fab_events_push(&eng->events, FAB_EV_SEND_DONE, -FI_ECANCELED, s->id, NULL, 0);
        free(s);
    }
    return NULL;
}

uint64_t fab_progress_round_age_ns(struct fab_engine *eng)
{
    uint64_t started = __atomic_load_n(&eng->round_started_ns, __ATOMIC_RELAXED);
    if (!started || __atomic_load_n(&eng->stop, __ATOMIC_RELAXED))
        return 0;
    uint64_t now = now_ns();
    return now > started ? now - started : 0;
}

uint64_t fab_progress_posting_to(struct fab_engine *eng)
{
    return __atomic_load_n(&eng->posting_to, __ATOMIC_RELAXED);
}

/* After the endpoint is closed: free work that will never complete. */
void fab_progress_drop_all(struct fab_engine *eng)
{
    struct fab_batch *lists[2] = {eng->post_head, eng->pending_head};
    for (int i = 0; i < 2; i++)
        while (lists[i]) {
            struct fab_batch *b = lists[i];
            lists[i] = b->next;
            fab_free_batch(b);
        }
    while (eng->inflight_head) {
        struct fab_batch *b = eng->inflight_head;
        eng->inflight_head = b->inflight_next;
        fab_free_batch(b);
    }
    eng->post_head = eng->post_tail = eng->pending_head = eng->pending_tail = NULL;
    while (eng->send_head) {
        struct fab_send *s = eng->send_head;
        eng->send_head = s->next;
        free(s);
    }
    eng->send_tail = NULL;
}
