/* fabric-lib: engine lifecycle, addresses, memory registration, counters and errors. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_internal.h"

/* Per thread, so that two Python threads never read each other's message. */
static __thread char tls_error[512];

void fab_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_error, sizeof(tls_error), fmt, ap);
    va_end(ap);
}

const char *fab_last_error(fab_engine *eng)
{
    (void)eng;
    return tls_error;
}

const char *fab_strerror(int code) { return fi_strerror(code < 0 ? -code : code); }
const char *fab_provider_name(fab_engine *eng) { return eng->info->fabric_attr->prov_name; }
const char *fab_domain_name(fab_engine *eng) { return eng->info->domain_attr->name; }
uint64_t fab_mr_mode(fab_engine *eng) { return eng->mr_mode; }
uint64_t fab_max_msg_bytes(fab_engine *eng) { return eng->max_msg_bytes; }
uint64_t fab_max_control_bytes(void) { return FAB_MAX_CONTROL_BYTES; }
void fab_free(void *data) { free(data); }

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Neither shm nor tcp;ofi_rxm (1.17) report a write with a wrong key to the initiator (shm
 * writes through the address regardless), so descriptors carry a check the initiator verifies:
 * it catches corruption and mix-ups, not malice (the peer is trusted once authenticated). */
uint64_t fab_desc_check(const fab_region_desc *d)
{
    return mix64(d->addr_base ^ mix64(d->key ^ mix64(d->len ^ mix64(d->mr_mode))));
}

void fab_get_stats(fab_engine *eng, fab_stats *out)
{
    pthread_mutex_lock(&eng->lock);
    *out = eng->stats;
    pthread_mutex_unlock(&eng->lock);
}

static struct fi_info *make_hints(const char *provider, const char *domain, int want_hmem)
{
    struct fi_info *hints = fi_allocinfo();
    if (!hints)
        return NULL;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_MSG | FI_SEND | FI_RECV;
    if (want_hmem)
        hints->caps |= FI_HMEM;
    /* every op carries its own fi_context2, so both context modes are fine */
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    /* the library handles all of these (see fab_register and fab_submit_writes) */
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                                  FI_MR_PROV_KEY | FI_MR_ENDPOINT | (want_hmem ? FI_MR_HMEM : 0);
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->fabric_attr->prov_name = strdup(provider);
    (void)domain; /* matched in pick_domain: utility providers (ofi_rxm 1.17) ignore it here */
    return hints;
}

/* The first entry whose domain (NIC) name is `domain`, or the first entry for NULL. */
static struct fi_info *pick_domain(struct fi_info *list, const char *domain, char *err,
                                   size_t err_len)
{
    if (!domain || !domain[0])
        return list;
    size_t used = 0;
    used += snprintf(err, err_len, "no domain named '%s'; this provider offers:", domain);
    for (struct fi_info *i = list; i; i = i->next) {
        if (i->domain_attr->name && strcmp(i->domain_attr->name, domain) == 0)
            return i;
        if (used < err_len && i->domain_attr->name && !strstr(err, i->domain_attr->name))
            used += snprintf(err + used, err_len - used, " %s", i->domain_attr->name);
    }
    return NULL;
}

#define CHECK(call, what)                                                                      \
    do {                                                                                       \
        rc = (call);                                                                           \
        if (rc) {                                                                              \
            snprintf(err, err_len, "%s failed: %s", what, fi_strerror(-rc));                   \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

int fab_open(const char *provider, const char *domain, int want_hmem, fab_engine **out,
             char *err, size_t err_len)
{
    int rc;
    *out = NULL;
    fab_engine *eng = calloc(1, sizeof(*eng));
    struct fi_info *hints = make_hints(provider, domain, want_hmem);
    if (!eng || !hints) {
        snprintf(err, err_len, "out of memory");
        free(eng);
        fi_freeinfo(hints);
        return -FI_ENOMEM;
    }
    pthread_mutex_init(&eng->lock, NULL);
    pthread_cond_init(&eng->wake, NULL);
    eng->next_key = 1;
    rc = fab_events_init(&eng->events);
    if (rc) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }

    rc = fi_getinfo(FI_VERSION(1, 14), NULL, NULL, 0, hints, &eng->info);
    if (rc) {
        snprintf(err, err_len,
                 "no libfabric provider '%s'%s%s offers RDM endpoints with RMA writes: %s",
                 provider, domain ? " on domain " : "", domain ? domain : "", fi_strerror(-rc));
        goto fail;
    }
    struct fi_info *chosen = pick_domain(eng->info, domain, err, err_len);
    if (!chosen) {
        rc = -FI_ENODEV;
        goto fail;
    }
    if (chosen != eng->info) { /* keep only the chosen entry */
        struct fi_info *one = fi_dupinfo(chosen);
        fi_freeinfo(eng->info);
        eng->info = one;
        if (!one) {
            snprintf(err, err_len, "out of memory");
            rc = -FI_ENOMEM;
            goto fail;
        }
    }
    eng->mr_mode = (uint64_t)eng->info->domain_attr->mr_mode;
    eng->max_msg_bytes = eng->info->ep_attr->max_msg_size;
    const char *merge_env = getenv("DISAGGSDK_FABRIC_MAX_MERGED_BYTES");
    eng->max_merged_bytes = merge_env ? strtoull(merge_env, NULL, 0) : 0;
    if (eng->max_merged_bytes == 0 || eng->max_merged_bytes > eng->max_msg_bytes)
        eng->max_merged_bytes = eng->max_msg_bytes;
    eng->merge_counts = eng->info->domain_attr->cq_data_size >= 8;

    CHECK(fi_fabric(eng->info->fabric_attr, &eng->fabric, NULL), "fi_fabric");
    CHECK(fi_domain(eng->fabric, eng->info, &eng->domain, NULL), "fi_domain");

    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_NONE};
    CHECK(fi_cq_open(eng->domain, &cq_attr, &eng->cq, NULL), "fi_cq_open");
    struct fi_av_attr av_attr = {.type = eng->info->domain_attr->av_type};
    if (av_attr.type == FI_AV_UNSPEC)
        av_attr.type = FI_AV_MAP;
    CHECK(fi_av_open(eng->domain, &av_attr, &eng->av, NULL), "fi_av_open");
    CHECK(fi_endpoint(eng->domain, eng->info, &eng->ep, NULL), "fi_endpoint");
    CHECK(fi_ep_bind(eng->ep, &eng->av->fid, 0), "fi_ep_bind(av)");
    CHECK(fi_ep_bind(eng->ep, &eng->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
    CHECK(fi_enable(eng->ep), "fi_enable");
    CHECK(fab_post_recvs(eng), "posting control receive buffers");

    rc = pthread_create(&eng->thread, NULL, fab_progress_main, eng);
    if (rc) {
        snprintf(err, err_len, "cannot start the progress thread (errno %d)", rc);
        rc = -FI_EOTHER;
        goto fail;
    }
    eng->thread_started = 1;
    fi_freeinfo(hints);
    *out = eng;
    return 0;

fail:
    fi_freeinfo(hints);
    fab_close(eng);
    return rc < 0 ? rc : -rc;
}

void fab_shutdown(fab_engine *eng)
{
    pthread_mutex_lock(&eng->lock);
    eng->stop = 1;
    pthread_cond_broadcast(&eng->wake);
    pthread_mutex_unlock(&eng->lock);
    fab_events_shutdown(&eng->events);
}

void fab_close(fab_engine *eng)
{
    if (!eng)
        return;
    fab_shutdown(eng);
    if (eng->thread_started)
        pthread_join(eng->thread, NULL);
    /* the endpoint goes first: nothing can complete into freed contexts afterwards */
    if (eng->ep)
        fi_close(&eng->ep->fid);
    fab_progress_drop_all(eng);
    if (eng->recv_mr)
        fi_close(&eng->recv_mr->fid);
    free(eng->recv_bufs);
    for (size_t i = 0; i < eng->num_mrs; i++)
        if (eng->mrs[i].mr)
            fi_close(&eng->mrs[i].mr->fid);
    free(eng->mrs);
    free(eng->directs); /* the mappings themselves belong to the caller */
    free(eng->peers);
    if (eng->av)
        fi_close(&eng->av->fid);
    if (eng->cq)
        fi_close(&eng->cq->fid);
    if (eng->domain)
        fi_close(&eng->domain->fid);
    if (eng->fabric)
        fi_close(&eng->fabric->fid);
    if (eng->info)
        fi_freeinfo(eng->info);
    fab_imm_destroy(&eng->imms);
    if (eng->events.ring)
        fab_events_destroy(&eng->events);
    pthread_mutex_destroy(&eng->lock);
    pthread_cond_destroy(&eng->wake);
    free(eng);
}

int fab_address(fab_engine *eng, uint8_t *buf, size_t *len)
{
    fab_set_error("%s", ""); /* no stale message from an earlier call */
    int rc = fi_getname(&eng->ep->fid, buf, len);
    if (rc)
        fab_set_error("fi_getname failed: %s (buffer %zu bytes)", fi_strerror(-rc), *len);
    return rc;
}

int fab_insert_peer(fab_engine *eng, const uint8_t *addr, size_t len, uint64_t *peer_out)
{
    fab_set_error("%s", ""); /* no stale message from an earlier call */
    (void)len; /* the provider knows its address format's length */
    fi_addr_t fa = FI_ADDR_UNSPEC;
    pthread_mutex_lock(&eng->lock);
    int n = fi_av_insert(eng->av, addr, 1, &fa, 0, NULL);
    int rc = 0;
    if (n != 1) {
        rc = n < 0 ? n : -FI_EINVAL;
        fab_set_error("fi_av_insert failed: %s; is this an address of the same provider?",
                      fi_strerror(-rc));
    } else {
        fi_addr_t *peers = realloc(eng->peers, (eng->num_peers + 1) * sizeof(fi_addr_t));
        if (!peers) {
            rc = -FI_ENOMEM;
        } else {
            eng->peers = peers;
            eng->peers[eng->num_peers++] = fa;
            *peer_out = fa;
        }
    }
    pthread_mutex_unlock(&eng->lock);
    return rc;
}
