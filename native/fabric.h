/*
 * fabric-lib: paged RDMA writes with immediate counters over libfabric.
 *
 * This header is also the cffi cdef: native/build_fabric.py drops the preprocessor lines and
 * feeds the rest to cffi, so keep it to plain declarations (no macros, no inline code).
 *
 * Threading model: one progress thread per engine owns the endpoint and the completion queue.
 * Calls from other threads only enqueue commands (writes, sends) under a short lock and wake
 * that thread; completions come back as fab_event records through fab_wait_events(), which
 * blocks without the Python GIL (cffi releases it for every call).
 *
 * Return codes: 0 on success, a negative libfabric errno (-FI_E*) on failure;
 * fab_strerror() turns it into text and fab_last_error() gives the engine's detailed message.
 */
#ifndef DISAGGSDK_FABRIC_H
#define DISAGGSDK_FABRIC_H

#include <stddef.h>
#include <stdint.h>

typedef struct fab_engine fab_engine;

/* Event kinds delivered by fab_wait_events. */
enum {
    FAB_EV_BATCH_DONE = 1, /* a write batch completed locally; status 0 or -errno */
    FAB_EV_IMM_DONE = 2,   /* an expected immediate count was reached */
    FAB_EV_RECV = 3,       /* a control message arrived: data/len valid, free with fab_free */
    FAB_EV_SEND_DONE = 4,  /* a control message was sent; status 0 or -errno */
    FAB_EV_ERROR = 5       /* an asynchronous provider error not tied to a request */
};

typedef struct {
    int32_t kind;    /* FAB_EV_* */
    int32_t status;  /* 0 or a negative libfabric errno */
    uint64_t id;     /* batch id, immediate value, or send id */
    void *data;      /* FAB_EV_RECV only: malloc'd message bytes owned by the receiver */
    uint64_t len;    /* FAB_EV_RECV only: message length in bytes */
} fab_event;

/* What a peer needs to write into a registered region. Plain values: serialize freely. */
typedef struct {
    uint64_t addr_base; /* remote address of byte 0: virtual address (FI_MR_VIRT_ADDR) or 0 */
    uint64_t key;       /* remote protection key */
    uint64_t len;       /* region length in bytes */
    uint64_t mr_mode;   /* the target's FI_MR_* bits: must match the initiator's provider */
    uint64_t check;     /* hash of the fields above: a corrupted or edited descriptor is refused */
} fab_region_desc;

/* Counters kept by the engine; all monotonic. */
typedef struct {
    uint64_t writes_posted;       /* fi_writedata calls (after coalescing) */
    uint64_t writes_requested;    /* writes in submitted batches (before coalescing) */
    uint64_t eagain;              /* times the provider said -FI_EAGAIN */
    uint64_t imm_received;        /* remote writes with immediate data seen */
    uint64_t imm_late;            /* immediates for a fired or cancelled counter: dropped */
    uint64_t imm_early;           /* immediates counted before their expect() */
    uint64_t cq_errors;           /* error completions read from the CQ */
    uint64_t recv_dropped;        /* control messages lost (truncated or failed) */
    uint64_t writes_direct;       /* entries copied straight into a mapped same-host region */
} fab_stats;

/* Engine lifecycle. provider: "shm", "tcp;ofi_rxm", "verbs;ofi_rxm", "efa", ...
 * domain: a NIC/domain name ("lo", "eth0", "mlx5_0") or NULL for the provider's first. */
int fab_open(const char *provider, const char *domain, int want_hmem, fab_engine **out,
             char *err, size_t err_len);
void fab_close(fab_engine *eng);
const char *fab_last_error(fab_engine *eng);
const char *fab_strerror(int code);
const char *fab_provider_name(fab_engine *eng);
const char *fab_domain_name(fab_engine *eng);
uint64_t fab_mr_mode(fab_engine *eng);
uint64_t fab_max_msg_bytes(fab_engine *eng);
void fab_get_stats(fab_engine *eng, fab_stats *out);

/* Addresses: this engine's address bytes; a peer's address -> a peer handle. */
int fab_address(fab_engine *eng, uint8_t *buf, size_t *len);
int fab_insert_peer(fab_engine *eng, const uint8_t *addr, size_t len, uint64_t *peer_out);

/* Memory registration. iface 0 = host memory, 1 = CUDA device memory (device = ordinal).
 * remote_write 0: local access only (a write source; peers' writes with its key are refused by
 * the provider), 1: peers holding the descriptor may write into it. */
int fab_register(fab_engine *eng, void *ptr, uint64_t len, int iface, int device, int remote_write,
                 uint64_t *handle_out, fab_region_desc *desc_out);
int fab_deregister(fab_engine *eng, uint64_t handle);

/* Paged writes. Entry i copies len[i] bytes from src region offset src_off[i] to destination
 * offset dst_off[i], carrying immediate imm[i]. Entries contiguous on both sides with the same
 * immediate are merged into one write; the merged write tells the target how many entries it
 * stands for, so immediate counts stay in entries. One FAB_EV_BATCH_DONE per call.
 * Bounds are checked here against both regions: a bad entry fails the call, nothing is sent. */
int fab_submit_writes(fab_engine *eng, uint64_t batch_id, uint64_t peer, uint64_t src_handle,
                      const fab_region_desc *dst, const uint64_t *src_off, const uint64_t *dst_off,
                      const uint64_t *len, const uint32_t *imm, uint64_t n);

/* Same-host direct writes. `mapped` is this process's mapping of the whole region `dst`
 * describes (the target's shared memory, mapped by the caller, who keeps it mapped until
 * fab_close). From then on the progress thread copies batches for `dst` with memcpy and sends
 * each run of one immediate as a single zero-length write carrying its entry count, so the
 * target's counters see exactly what they would have (no kernel copy on the target's core). */
int fab_attach_direct(fab_engine *eng, const fab_region_desc *dst, void *mapped);

/* Immediate counters: FAB_EV_IMM_DONE(id = imm) once `count` entries carrying imm have
 * landed, counting those that landed before this call. Later arrivals are counted and dropped. */
int fab_expect(fab_engine *eng, uint32_t imm, uint64_t count);
int fab_cancel(fab_engine *eng, uint32_t imm);

/* Control messages of at most fab_max_control_bytes() bytes. */
uint64_t fab_max_control_bytes(void);
int fab_send(fab_engine *eng, uint64_t send_id, uint64_t peer, const void *buf, uint64_t len);

/* Wait up to timeout_ms (0: do not wait) for events; returns how many were written to out
 * (>= 0) or a negative errno; -FI_ESHUTDOWN once the engine is stopping. */
int fab_wait_events(fab_engine *eng, fab_event *out, int max_events, int timeout_ms);
void fab_free(void *data);

/* Nanoseconds since the progress thread last began a round; 0 once it stopped. Rounds take
 * microseconds (an idle thread naps <= 200 us at a time), so seconds mean the thread is stuck
 * inside the provider: with shm, a peer killed while holding a spinlock of our queue (in
 * shared memory) leaves it spinning for good. The process must then be replaced. */
uint64_t fab_progress_round_age_ns(fab_engine *eng);
/* The peer handle + 1 that the progress thread is posting a write or message to right now, 0 when
 * it is not posting: for a stuck thread, whose queue is poisoned. */
uint64_t fab_progress_posting_to(fab_engine *eng);

/* Wake every waiter and stop accepting work; fab_close still has to be called. */
void fab_shutdown(fab_engine *eng);

#endif
