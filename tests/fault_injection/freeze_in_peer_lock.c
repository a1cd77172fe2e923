/*
 * LD_PRELOAD fault injector: on SIGUSR2, the next thread that takes a pthread spinlock living in
 * another process's /dev/shm file (libfabric shm's queue lock of a peer) keeps it and stops for
 * good, after creating "$DISAGGSDK_FREEZE_MARK_DIR/frozen-<pid>". The test then SIGKILLs the
 * process: exactly the state a process killed inside the provider's critical section leaves
 * behind (the lock is held by nobody alive), reached on purpose instead of by bad luck.
 *
 * Until SIGUSR2 arrives the wrapper only reads one flag, so processes that are never armed run
 * as without it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int (*real_spin_lock)(pthread_spinlock_t *);
static volatile sig_atomic_t armed;
static int frozen;

static void arm(int sig)
{
    (void)sig;
    armed = 1;
}

__attribute__((constructor)) static void install(void)
{
    real_spin_lock = (int (*)(pthread_spinlock_t *))dlsym(RTLD_NEXT, "pthread_spin_lock");
    signal(SIGUSR2, arm);
}

/* Whether addr lies in a /dev/shm mapping that is not this process's own ("<pid>:..."). */
static int in_peer_shm(const void *addr)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps)
        return 0;
    char line[512], own[32];
    snprintf(own, sizeof own, "/dev/shm/%d:", (int)getpid());
    uintptr_t a = (uintptr_t)addr;
    int found = 0;
    while (!found && fgets(line, sizeof line, maps)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) != 2 || a < lo || a >= hi)
            continue;
        const char *path = strstr(line, "/dev/shm/");
        found = path && strncmp(path, own, strlen(own)) != 0;
        break;
    }
    fclose(maps);
    return found;
}

int pthread_spin_lock(pthread_spinlock_t *lock)
{
    int rc = real_spin_lock(lock);
    if (armed && rc == 0 && in_peer_shm((const void *)lock)
        && !__atomic_exchange_n(&frozen, 1, __ATOMIC_SEQ_CST)) {
        const char *dir = getenv("DISAGGSDK_FREEZE_MARK_DIR");
        if (dir) {
            char path[512];
            snprintf(path, sizeof path, "%s/frozen-%d", dir, (int)getpid());
            int fd = open(path, O_CREAT | O_WRONLY, 0600);
            if (fd >= 0)
                close(fd);
        }
        for (;;)
            pause(); /* hold the peer's lock until killed */
    }
    return rc;
}
