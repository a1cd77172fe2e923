/* Memory registration: keys, provider mr_mode handling, and the descriptors peers get. */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "fab_internal.h"

int fab_register(fab_engine *eng, void *ptr, uint64_t len, int iface, int device, int remote_write,
                 uint64_t *handle_out, fab_region_desc *desc_out)
{
    fab_set_error("%s", ""); /* no stale message from an earlier call */
    if (!ptr || len == 0) {
        fab_set_error("cannot register an empty region (ptr %p, %llu bytes)", ptr,
                      (unsigned long long)len);
        return -FI_EINVAL;
    }
    /* Keys are ours to choose unless FI_MR_PROV_KEY. Random, not sequential: with tcp a region
     * is reachable by anyone who can reach the port and guess the key. */
    uint64_t key = 0;
    if (getrandom(&key, sizeof(key), 0) != sizeof(key)) {
        pthread_mutex_lock(&eng->lock);
        key = eng->next_key++;
        pthread_mutex_unlock(&eng->lock);
    }
    size_t key_bytes = eng->info->domain_attr->mr_key_size;
    if (key_bytes > 0 && key_bytes < sizeof(key))
        key &= (1ull << (8 * key_bytes)) - 1;

    struct iovec iov = {.iov_base = ptr, .iov_len = len};
    struct fi_mr_attr attr = {
        .mr_iov = &iov,
        .iov_count = 1,
        /* No remote read ever (nothing here reads a peer's memory); remote write only where a
         * peer is meant to write: a source region's key then opens nothing (ofi_mr_verify). */
        .access = FI_WRITE | FI_READ | FI_SEND | FI_RECV | (remote_write ? FI_REMOTE_WRITE : 0),
        .requested_key = key,
        .iface = iface == 1 ? FI_HMEM_CUDA : FI_HMEM_SYSTEM,
    };
    attr.device.cuda = device;
    struct fid_mr *mr = NULL;
    int rc = fi_mr_regattr(eng->domain, &attr, 0, &mr);
    if (rc) {
        fab_set_error("fi_mr_regattr(%llu bytes%s) failed: %s", (unsigned long long)len,
                      iface == 1 ? ", CUDA memory" : "", fi_strerror(-rc));
        return rc;
    }
    if (eng->mr_mode & FI_MR_ENDPOINT) {
        rc = fi_mr_bind(mr, &eng->ep->fid, 0);
        if (!rc)
            rc = fi_mr_enable(mr);
        if (rc) {
            fab_set_error("binding the region to the endpoint failed: %s", fi_strerror(-rc));
            fi_close(&mr->fid);
            return rc;
        }
    }
    desc_out->addr_base = (eng->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)ptr : 0;
    desc_out->key = fi_mr_key(mr);
    desc_out->len = len;
    desc_out->mr_mode = eng->mr_mode;
    desc_out->check = fab_desc_check(desc_out);

    pthread_mutex_lock(&eng->lock);
    size_t slot = eng->num_mrs;
    for (size_t i = 0; i < eng->num_mrs; i++)
        if (!eng->mrs[i].mr) {
            slot = i;
            break;
        }
    if (slot == eng->num_mrs) {
        struct fab_mr_entry *mrs = realloc(eng->mrs, (eng->num_mrs + 1) * sizeof(*mrs));
        if (!mrs) {
            pthread_mutex_unlock(&eng->lock);
            fi_close(&mr->fid);
            return -FI_ENOMEM;
        }
        eng->mrs = mrs;
        eng->num_mrs++;
    }
    eng->mrs[slot] = (struct fab_mr_entry){
        .mr = mr, .ptr = ptr, .len = len, .desc = fi_mr_desc(mr), .inflight_batches = 0};
    pthread_mutex_unlock(&eng->lock);
    *handle_out = slot + 1; /* 0 is never a valid handle */
    return 0;
}

int fab_deregister(fab_engine *eng, uint64_t handle)
{
    fab_set_error("%s", ""); /* no stale message from an earlier call */
    pthread_mutex_lock(&eng->lock);
    int rc = 0;
    if (handle == 0 || handle > eng->num_mrs || !eng->mrs[handle - 1].mr) {
        fab_set_error("unknown memory region handle %llu", (unsigned long long)handle);
        rc = -FI_EINVAL;
    } else if (eng->mrs[handle - 1].inflight_batches) {
        fab_set_error("memory region %llu still has %llu write batches in flight; wait for them",
                      (unsigned long long)handle,
                      (unsigned long long)eng->mrs[handle - 1].inflight_batches);
        rc = -FI_EBUSY;
    } else {
        rc = fi_close(&eng->mrs[handle - 1].mr->fid);
        eng->mrs[handle - 1].mr = NULL;
        if (rc)
            fab_set_error("fi_close(mr) failed: %s", fi_strerror(-rc));
    }
    pthread_mutex_unlock(&eng->lock);
    return rc;
}
