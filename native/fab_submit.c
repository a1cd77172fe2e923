/*
 * The calls Python threads make: validate and coalesce a batch, queue it (or a control
 * message) for the progress thread under eng->lock, and return at once; expect/cancel touch
 * the immediate table. Nothing here talks to the endpoint (see fab_progress.c).
 */
#include <stdlib.h>
#include <string.h>

#include "fab_internal.h"

static int peer_known(struct fab_engine *eng, fi_addr_t peer)
{
    for (size_t i = 0; i < eng->num_peers; i++)
        if (eng->peers[i] == peer)
            return 1;
    return 0;
}

static int check_entry(uint64_t i, uint64_t off, uint64_t len, uint64_t region_len,
                       const char *side)
{
    if (len == 0 || off > region_len || len > region_len - off) {
        fab_set_error("write %llu: %s range [%llu, %llu) is outside the %s region of %llu bytes"
                      "%s",
                      (unsigned long long)i, side, (unsigned long long)off,
                      (unsigned long long)(off + len), side, (unsigned long long)region_len,
                      len == 0 ? " (zero-length writes are not allowed)" : "");
        return -FI_EINVAL;
    }
    return 0;
}

int fab_submit_writes(fab_engine *eng, uint64_t batch_id, uint64_t peer, uint64_t src_handle,
                      const fab_region_desc *dst, const uint64_t *src_off, const uint64_t *dst_off,
                      const uint64_t *len, const uint32_t *imm, uint64_t n)
{
    fab_set_error("%s", ""); /* no stale message from an earlier call */
    pthread_mutex_lock(&eng->lock);
    int ok = src_handle >= 1 && src_handle <= eng->num_mrs && eng->mrs[src_handle - 1].mr;
    struct fab_mr_entry src = ok ? eng->mrs[src_handle - 1] : (struct fab_mr_entry){0};
    int known = peer_known(eng, (fi_addr_t)peer);
    pthread_mutex_unlock(&eng->lock);
    if (!ok) {
        fab_set_error("unknown source region handle %llu", (unsigned long long)src_handle);
        return -FI_EINVAL;
    }
    if (!known) {
        fab_set_error("unknown peer handle %llu: insert the peer's address first",
                      (unsigned long long)peer);
        return -FI_EINVAL;
    }
    if (dst->check != fab_desc_check(dst)) {
        fab_set_error("the destination region descriptor fails its check (corrupted, or a field "
                      "was changed): use the descriptor exactly as the target's register() made it");
        return -FI_EINVAL;
    }
    if ((dst->mr_mode ^ eng->mr_mode) & FI_MR_VIRT_ADDR) {
        fab_set_error("the destination region was registered with another provider (mr_mode %#llx, "
                      "here %#llx): both ends must open the same provider",
                      (unsigned long long)dst->mr_mode, (unsigned long long)eng->mr_mode);
        return -FI_EINVAL;
    }
    for (uint64_t i = 0; i < n; i++) {
        int rc = check_entry(i, src_off[i], len[i], src.len, "source");
        if (!rc)
            rc = check_entry(i, dst_off[i], len[i], dst->len, "destination");
        if (rc)
            return rc;
    }

    struct fab_batch *b = calloc(1, sizeof(*b));
    struct fab_write *writes = n ? malloc(n * sizeof(*writes)) : NULL;
    if (!b || (n && !writes)) {
        free(b);
        free(writes);
        return -FI_ENOMEM;
    }
    /* coalesce runs contiguous on both sides with the same immediate */
    uint64_t m = 0;
    for (uint64_t i = 0; i < n; i++) {
        struct fab_write *w = m ? &writes[m - 1] : NULL;
        if (w && eng->merge_counts && (uint32_t)w->data == imm[i] &&
            w->src_off + w->len == src_off[i] && w->dst_off + w->len == dst_off[i] &&
            w->len + len[i] <= eng->max_merged_bytes && (w->data >> 32) < 0xffffffffull) {
            w->len += len[i];
            w->data += 1ull << 32;
            continue;
        }
        writes[m++] = (struct fab_write){src_off[i], dst_off[i], len[i],
                                         (1ull << 32) | (uint64_t)imm[i]};
    }
    if (!eng->merge_counts)
        for (uint64_t i = 0; i < m; i++)
            writes[i].data &= 0xffffffffull; /* 4-byte CQ data: the immediate alone */
    b->ops = m ? calloc(m, sizeof(struct fab_op)) : NULL;
    if (m && !b->ops) {
        free(b);
        free(writes);
        return -FI_ENOMEM;
    }
    b->id = batch_id;
    b->peer = (fi_addr_t)peer;
    b->src_handle = src_handle;
    b->src_ptr = src.ptr;
    b->src_desc = src.desc;
    b->dst = *dst;
    b->num_writes = m;
    b->writes = writes;

    pthread_mutex_lock(&eng->lock);
    for (size_t i = 0; i < eng->num_directs; i++) { /* only attached where merge_counts holds */
        struct fab_direct *d = &eng->directs[i];
        if (d->addr_base == dst->addr_base && d->key == dst->key && d->len == dst->len)
            b->direct = d->ptr;
    }
    if (eng->stop) {
        pthread_mutex_unlock(&eng->lock);
        free(b->ops);
        free(writes);
        free(b);
        fab_set_error("the transfer engine is closed");
        return -FI_ESHUTDOWN;
    }
    eng->mrs[src_handle - 1].inflight_batches++;
    eng->stats.writes_requested += n;
    if (eng->pending_tail)
        eng->pending_tail->next = b;
    else
        eng->pending_head = b;
    eng->pending_tail = b;
    pthread_cond_signal(&eng->wake);
    pthread_mutex_unlock(&eng->lock);
    return 0;
}

int fab_expect(fab_engine *eng, uint32_t imm, uint64_t count)
{
    fab_set_error("%s", ""); /* no stale message from an earlier call */
    pthread_mutex_lock(&eng->lock);
    int rc = fab_imm_expect(eng, imm, count);
    pthread_mutex_unlock(&eng->lock);
    return rc;
}

int fab_cancel(fab_engine *eng, uint32_t imm)
{
    pthread_mutex_lock(&eng->lock);
    fab_imm_cancel(eng, imm);
    pthread_mutex_unlock(&eng->lock);
    return 0;
}

int fab_send(fab_engine *eng, uint64_t send_id, uint64_t peer, const void *buf, uint64_t len)
{
    fab_set_error("%s", ""); /* no stale message from an earlier call */
    if (len > FAB_MAX_CONTROL_BYTES) {
        fab_set_error("control message of %llu bytes exceeds the %u-byte limit",
                      (unsigned long long)len, FAB_MAX_CONTROL_BYTES);
        return -FI_EMSGSIZE;
    }
    struct fab_send *s = calloc(1, sizeof(*s) + (len ? len : 1));
    if (!s)
        return -FI_ENOMEM;
    s->id = send_id;
    s->peer = (fi_addr_t)peer;
    s->len = len;
    memcpy(s->buf, buf, len);
    pthread_mutex_lock(&eng->lock);
    int rc = 0;
    if (!peer_known(eng, s->peer)) {
        fab_set_error("unknown peer handle %llu: insert the peer's address first",
                      (unsigned long long)peer);
        rc = -FI_EINVAL;
    } else if (eng->stop) {
        fab_set_error("the transfer engine is closed");
        rc = -FI_ESHUTDOWN;
    } else {
        if (eng->send_tail)
            eng->send_tail->next = s;
        else
            eng->send_head = s;
        eng->send_tail = s;
        pthread_cond_signal(&eng->wake);
    }
    pthread_mutex_unlock(&eng->lock);
    if (rc)
        free(s);
    return rc;
}

int fab_wait_events(fab_engine *eng, fab_event *out, int max_events, int timeout_ms)
{
    return fab_events_wait(&eng->events, out, max_events, timeout_ms);
}


int fab_attach_direct(fab_engine *eng, const fab_region_desc *dst, void *mapped)
{
    fab_set_error("%s", "");
    if (!mapped) {
        fab_set_error("no mapping given for the direct region");
        return -FI_EINVAL;
    }
    if (dst->check != fab_desc_check(dst)) {
        fab_set_error("the destination region descriptor fails its check: use it exactly as the "
                      "target's register() made it");
        return -FI_EINVAL;
    }
    if (!eng->merge_counts) {
        fab_set_error("direct writes need 8 bytes of CQ data (entry counts); this provider has less");
        return -FI_EOPNOTSUPP;
    }
    pthread_mutex_lock(&eng->lock);
    struct fab_direct *ds = realloc(eng->directs, (eng->num_directs + 1) * sizeof(*ds));
    if (!ds) {
        pthread_mutex_unlock(&eng->lock);
        return -FI_ENOMEM;
    }
    eng->directs = ds;
    ds[eng->num_directs++] = (struct fab_direct){dst->addr_base, dst->key, dst->len, mapped};
    pthread_mutex_unlock(&eng->lock);
    return 0;
}
