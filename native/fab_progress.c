/*
 * The progress thread (callers feed it through fab_submit.c).
 *
 * Callers (Python threads) validate and coalesce a batch, then append it to eng->pending under
 * eng->lock and signal eng->wake. The progress thread moves pending work to its own post list,
 * posts writes until the provider says -FI_EAGAIN (the rest waits for the next round: no caller
 * ever spins), reads the completion queue, and turns completions into events. It never calls
 * into Python.
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

static void free_batch(struct fab_batch *b)
{
    free(b->ops);
    free(b->writes);
    free(b);
}

static void finish_batch(struct fab_engine *eng, struct fab_batch *b)
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
    free_batch(b);
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
            int rc = fi_writedata(eng->ep, b->src_ptr + w->src_off, w->len, b->src_desc, w->data,
                                  b->peer, b->dst.addr_base + w->dst_off, b->dst.key, &op->ctx);
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
            finish_batch(eng, b);
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
        if (!rc)
            rc = fi_send(eng->ep, s->buf, s->len, desc, s->peer, &s->op.ctx);
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
static uint64_t post_sends_and_writes(struct fab_engine *eng, struct fab_send **sends)
{
    return post_sends(eng, sends) + post_writes(eng);
}

static void complete_op(struct fab_engine *eng, struct fab_op *op, int status, uint64_t len)
{
    if (op->kind == FAB_OP_WRITE) {
        struct fab_batch *b = op->batch;
        if (status && b->status == 0)
            b->status = status;
        b->num_outstanding--;
        if (b->num_outstanding == 0 && b->num_posted == b->num_writes)
            finish_batch(eng, b);
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

        uint64_t work = post_sends_and_writes(eng, &sends);
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

/* After the endpoint is closed: free work that will never complete. */
void fab_progress_drop_all(struct fab_engine *eng)
{
    struct fab_batch *lists[2] = {eng->post_head, eng->pending_head};
    for (int i = 0; i < 2; i++)
        while (lists[i]) {
            struct fab_batch *b = lists[i];
            lists[i] = b->next;
            free_batch(b);
        }
    while (eng->inflight_head) {
        struct fab_batch *b = eng->inflight_head;
        eng->inflight_head = b->inflight_next;
        free_batch(b);
    }
    eng->post_head = eng->post_tail = eng->pending_head = eng->pending_tail = NULL;
    while (eng->send_head) {
        struct fab_send *s = eng->send_head;
        eng->send_head = s->next;
        free(s);
    }
    eng->send_tail = NULL;
}
