/* Internal structures of fabric-lib, shared by the .c files in native/ (not in the cdef). */
#ifndef DISAGGSDK_FAB_INTERNAL_H
#define DISAGGSDK_FAB_INTERNAL_H

#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "fabric.h"

#define FAB_MAX_CONTROL_BYTES (64u * 1024u)
#define FAB_NUM_RECV_BUFS 16
/* Backoff of the progress thread once nothing progressed (no post, no completion): poll flat
 * out for FAB_SPIN_NS, then nap FAB_SHORT_NAP_US between polls until FAB_IDLE_NS, then
 * FAB_IDLE_NAP_US. New work wakes it at once. On a shared 2-core machine a thread that spins
 * while its peer process copies the data steals that copy's core; the short naps cost little
 * latency next to a write of a megabyte and give the core back. */
#define FAB_SPIN_NS 20000ull
#define FAB_SHORT_NAP_US 20
#define FAB_IDLE_NS 2000000ull
#define FAB_IDLE_NAP_US 200
#define FAB_OP_MAGIC 0xfab0c0deu
#define FAB_MAX_BLOCKED_PEERS 16 /* peers skipped after -FI_EAGAIN within one posting round */
#define FAB_IMM_BUCKETS 4096u
#define FAB_MAX_RETIRED 8192u

enum fab_op_kind { FAB_OP_WRITE = 1, FAB_OP_SEND = 2, FAB_OP_RECV = 3 };

/* Every libfabric operation gets its own context that lives until its completion (FI_CONTEXT). */
struct fab_op {
    struct fi_context2 ctx; /* must stay first: libfabric hands back &ctx */
    uint32_t magic;
    int kind;
    struct fab_batch *batch; /* FAB_OP_WRITE */
    struct fab_send *send;   /* FAB_OP_SEND */
    int recv_slot;           /* FAB_OP_RECV */
};

struct fab_write {
    uint64_t src_off, dst_off, len;
    uint64_t data; /* remote CQ data: imm in the low 32 bits, merged entry count above */
};

struct fab_mr_entry {
    struct fid_mr *mr; /* NULL: free slot */
    uint8_t *ptr;
    uint64_t len;
    void *desc;
    uint64_t inflight_batches;
};

struct fab_batch {
    struct fab_batch *next;                     /* pending / post list */
    struct fab_batch *inflight_prev, *inflight_next; /* fully posted, completions outstanding */
    uint64_t id;
    fi_addr_t peer;
    uint64_t src_handle;
    uint8_t *src_ptr;
    void *src_desc;
    fab_region_desc dst;
    uint64_t num_writes, num_posted, num_outstanding;
    uint8_t *direct; /* the target region mapped here: copy, then signal (fab_attach_direct) */
    int status;
    struct fab_write *writes;
    struct fab_op *ops;
};

/* A destination region this process has mapped (same host): see fab_attach_direct. */
struct fab_direct {
    uint64_t addr_base, key, len;
    uint8_t *ptr;
};

struct fab_send {
    struct fab_send *next;
    uint64_t id;
    fi_addr_t peer;
    uint64_t len;
    struct fid_mr *mr; /* only where the provider needs FI_MR_LOCAL */
    struct fab_op op;
    uint8_t buf[]; /* len bytes */
};

struct fab_imm_entry {
    struct fab_imm_entry *next;
    uint32_t imm;
    int state; /* FAB_IMM_EARLY / EXPECTING / RETIRED */
    uint64_t expected, received, retired_seq;
};

struct fab_imm_table {
    struct fab_imm_entry *buckets[FAB_IMM_BUCKETS];
    uint64_t num_retired, retire_seq;
};

struct fab_event_queue {
    pthread_mutex_t lock;
    pthread_cond_t nonempty;
    fab_event *ring;
    size_t cap, head, count;
    int shutdown;
};

struct fab_engine {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_ep *ep;
    uint64_t mr_mode, max_msg_bytes;
    /* Coalesced writes grow up to this: max_msg_size unless env DISAGGSDK_FABRIC_MAX_MERGED_BYTES
     * says less (a tuning knob for NICs; on shm/tcp here a 1 MiB cap measured no better). */
    uint64_t max_merged_bytes;
    int merge_counts; /* cq_data_size >= 8: merged writes can carry their entry count */

    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock; /* guards everything below up to the event queue */
    pthread_cond_t wake;
    int stop;
    struct fab_batch *pending_head, *pending_tail; /* submitted, not yet handed to the thread */
    struct fab_send *send_head, *send_tail;
    struct fab_mr_entry *mrs;
    size_t num_mrs;
    struct fab_direct *directs;
    size_t num_directs;
    uint64_t next_key;
    fi_addr_t *peers;
    size_t num_peers;
    struct fab_imm_table imms;
    fab_stats stats;

    struct fab_event_queue events;

    /* CLOCK_MONOTONIC ns at which the progress thread last began a round (atomic: read by any
     * thread). It stops moving only while the thread is stuck inside the provider. */
    uint64_t round_started_ns;
    /* the peer handle + 1 while the thread is inside fi_writedata/fi_send to it, else 0 */
    uint64_t posting_to;

    /* owned by the progress thread only */
    struct fab_batch *post_head, *post_tail;
    struct fab_batch *inflight_head; /* freed by fab_close if their completions never come */
    uint8_t *recv_bufs;
    struct fid_mr *recv_mr;
    struct fab_op recv_ops[FAB_NUM_RECV_BUFS];
};

/* fabric.c */
void fab_set_error(const char *fmt, ...);
uint64_t fab_desc_check(const fab_region_desc *d);

/* fab_events.c */
int fab_events_init(struct fab_event_queue *q);
void fab_events_destroy(struct fab_event_queue *q);
void fab_events_push(struct fab_event_queue *q, int kind, int status, uint64_t id, void *data,
                     uint64_t len);
void fab_events_shutdown(struct fab_event_queue *q);
int fab_events_wait(struct fab_event_queue *q, fab_event *out, int max_events, int timeout_ms);

/* fab_imm.c (caller holds eng->lock) */
void fab_imm_add(struct fab_engine *eng, uint32_t imm, uint64_t weight);
int fab_imm_expect(struct fab_engine *eng, uint32_t imm, uint64_t count);
void fab_imm_cancel(struct fab_engine *eng, uint32_t imm);
void fab_imm_destroy(struct fab_imm_table *t);

/* fab_post.c */
uint64_t fab_post_work(struct fab_engine *eng, struct fab_send **sends);
void fab_finish_batch(struct fab_engine *eng, struct fab_batch *b);
void fab_free_batch(struct fab_batch *b);

/* fab_progress.c */
void *fab_progress_main(void *arg);
int fab_post_recvs(struct fab_engine *eng);
void fab_progress_drop_all(struct fab_engine *eng);

#endif
