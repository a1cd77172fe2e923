/* The event queue: the progress thread pushes, Python threads wait (without the GIL). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fab_internal.h"

int fab_events_init(struct fab_event_queue *q)
{
    memset(q, 0, sizeof(*q));
    q->cap = 256;
    q->ring = calloc(q->cap, sizeof(fab_event));
    if (!q->ring)
        return -FI_ENOMEM;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->nonempty, NULL);
    return 0;
}

void fab_events_destroy(struct fab_event_queue *q)
{
    /* undelivered messages still own their bytes */
    for (size_t i = 0; i < q->count; i++) {
        fab_event *ev = &q->ring[(q->head + i) % q->cap];
        free(ev->data);
    }
    free(q->ring);
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->nonempty);
}

/* The ring grows instead of dropping: a lost completion would hang a request forever. */
static int grow(struct fab_event_queue *q)
{
    size_t cap = q->cap * 2;
    fab_event *ring = calloc(cap, sizeof(fab_event));
    if (!ring)
        return -FI_ENOMEM;
    for (size_t i = 0; i < q->count; i++)
        ring[i] = q->ring[(q->head + i) % q->cap];
    free(q->ring);
    q->ring = ring;
    q->cap = cap;
    q->head = 0;
    return 0;
}

void fab_events_push(struct fab_event_queue *q, int kind, int status, uint64_t id, void *data,
                     uint64_t len)
{
    pthread_mutex_lock(&q->lock);
    if (q->count == q->cap && grow(q) != 0) {
        /* out of memory: keep the oldest events, which the waiters already expect */
        pthread_mutex_unlock(&q->lock);
        free(data);
        return;
    }
    fab_event *ev = &q->ring[(q->head + q->count) % q->cap];
    ev->kind = kind;
    ev->status = status;
    ev->id = id;
    ev->data = data;
    ev->len = len;
    q->count++;
    pthread_cond_broadcast(&q->nonempty);
    pthread_mutex_unlock(&q->lock);
}

void fab_events_shutdown(struct fab_event_queue *q)
{
    pthread_mutex_lock(&q->lock);
    q->shutdown = 1;
    pthread_cond_broadcast(&q->nonempty);
    pthread_mutex_unlock(&q->lock);
}

int fab_events_wait(struct fab_event_queue *q, fab_event *out, int max_events, int timeout_ms)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&q->lock);
    while (q->count == 0 && !q->shutdown && timeout_ms > 0) {
        if (pthread_cond_timedwait(&q->nonempty, &q->lock, &deadline) == ETIMEDOUT)
            break;
    }
    int n = 0;
    while (n < max_events && q->count > 0) {
        out[n++] = q->ring[q->head];
        q->head = (q->head + 1) % q->cap;
        q->count--;
    }
    int shut = q->shutdown;
    pthread_mutex_unlock(&q->lock);
    if (n == 0 && shut)
        return -FI_ESHUTDOWN;
    return n;
}
