/* The machine's compiled reference for trajcore's benchmarks: what this host does with no
 * Python and no trajcore in the way.
 *
 *   reference spawn WORKERS SECONDS
 *       WORKERS processes (one per core, by the caller's choice), each in a loop:
 *       posix_spawn of "/bin/sh -c true", then waitpid. The all-core spawn limit.
 *   reference trajectory WORKERS SECONDS FILTER_FILE UID_BASE
 *       WORKERS processes, each in a loop of "trajectories": the kernel work of one sandboxed
 *       trajectory without trajcore. A fork that switches to its own uid (UID_BASE + worker,
 *       when run as root), enters new user, mount, pid, ipc, uts and network namespaces
 *       (mapping its uid to itself, as bubblewrap does, and bringing loopback up), becomes pid 1
 *       of the new pid namespace, mounts a fresh /proc, sets no_new_privs and installs the
 *       seccomp filter read from FILTER_FILE (classic BPF, the bytes trajcore's slot server
 *       installs in every lease), then runs eight "/bin/sh -c true" one after another.
 *
 *   reference run FILE COMMAND
 *       Runs "/bin/sh -c COMMAND" (its output is this program's), waits for it and appends the
 *       CPU it and everything it reaped used, in microseconds, as one line to FILE; exits with
 *       its status. How bench/agent_mix.py counts a command's own CPU inside a sandbox.
 *
 * spawn and trajectory print one line of JSON: {"count": N, "seconds": S, "p50_s": X, "p99_s": Y}, where the
 * quantiles are of one spawn (spawn) or of one trajectory's set-up before its first command
 * (trajectory). A failure prints what failed and exits 1: no partial figure passes for a
 * measurement. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum { MAX_WORKERS = 64, MAX_SAMPLES = 1 << 15, SPAWNS_PER_TRAJECTORY = 8 };

/* Shared by every worker and its descendants (an anonymous shared mapping). */
typedef struct {
    long count[MAX_WORKERS];
    long samples[MAX_WORKERS];
    int failed;
    char error[256];
    double sample[MAX_WORKERS][MAX_SAMPLES];
} board;

static board *shared;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void fail(const char *what) {
    if (!shared->failed) {
        shared->failed = 1;
        snprintf(shared->error, sizeof shared->error, "%s: %s", what, strerror(errno));
    }
    _exit(1);
}

static void record(int worker, double seconds) {
    long at = shared->samples[worker];
    if (at < MAX_SAMPLES) {
        shared->sample[worker][at] = seconds;
        shared->samples[worker] = at + 1;
    }
}

/* One "/bin/sh -c true", waited for. */
static void spawn_true(void) {
    static char *const argv[] = {"/bin/sh", "-c", "true", NULL};
    pid_t child;
    int status = 0;
    errno = posix_spawn(&child, "/bin/sh", NULL, NULL, argv, environ);
    if (errno != 0)
        fail("posix_spawn /bin/sh");
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR)
            fail("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        errno = 0;
        fail("/bin/sh -c true did not exit 0");
    }
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        fail(path);
    close(fd);
}

typedef struct {
    struct sock_filter *filter;
    unsigned short length;
    unsigned uid_base;
} trajectory_plan;

/* pid 1 of the trajectory's pid namespace: its /proc, the filter, then the eight commands. */
static void trajectory_first(int worker, const trajectory_plan *plan, double started) {
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        fail("mount / private");
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        fail("mount /proc");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        fail("no_new_privs");
    struct sock_fprog program = {plan->length, plan->filter};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0) != 0)
        fail("seccomp");
    record(worker, now() - started);
    for (int i = 0; i < SPAWNS_PER_TRAJECTORY; i++)
        spawn_true();
    _exit(0);
}

/* One trajectory, from the worker's fork to its last command's end. */
static void trajectory(int worker, const trajectory_plan *plan) {
    double started = now();
    pid_t outer = fork();
    if (outer < 0)
        fail("fork");
    if (outer == 0) {
        if (geteuid() == 0) { /* the slot's own uid, never root */
            unsigned id = plan->uid_base + (unsigned)worker;
            if (setgroups(0, NULL) != 0 || setresgid(id, id, id) != 0 ||
                setresuid(id, id, id) != 0)
                fail("switch to the slot uid");
            (void)prctl(PR_SET_DUMPABLE, 1, 0, 0, 0); /* its own /proc/self, to write the maps */
        }
        uid_t uid = geteuid();
        gid_t gid = getegid();
        if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS |
                    CLONE_NEWNET) != 0)
            fail("unshare");
        char map[64];
        snprintf(map, sizeof map, "%u %u 1\n", (unsigned)uid, (unsigned)uid);
        write_file("/proc/self/uid_map", map);
        write_file("/proc/self/setgroups", "deny");
        snprintf(map, sizeof map, "%u %u 1\n", (unsigned)gid, (unsigned)gid);
        write_file("/proc/self/gid_map", map);
        int probe = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct ifreq loopback = {.ifr_name = "lo"};
        loopback.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
        if (probe < 0 || ioctl(probe, SIOCSIFFLAGS, &loopback) != 0)
            fail("bring up lo");
        close(probe);
        pid_t first = fork(); /* pid 1 of the new pid namespace */
        if (first < 0)
            fail("fork into the pid namespace");
        if (first == 0)
            trajectory_first(worker, plan, started);
        int status = 0;
        while (waitpid(first, &status, 0) < 0)
            if (errno != EINTR)
                fail("waitpid");
        _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
    }
    int status = 0;
    while (waitpid(outer, &status, 0) < 0)
        if (errno != EINTR)
            fail("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        errno = 0;
        fail("a trajectory failed");
    }
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int usage(void) {
    fprintf(stderr, "usage: reference spawn WORKERS SECONDS\n"
                    "       reference trajectory WORKERS SECONDS FILTER_FILE UID_BASE\n"
                    "       reference run FILE COMMAND\n");
    return 2;
}

static struct sock_filter *read_filter(const char *path, unsigned short *length) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat info;
    if (fd < 0 || fstat(fd, &info) != 0)
        return NULL;
    size_t size = (size_t)info.st_size;
    if (size == 0 || size % sizeof(struct sock_filter) != 0 ||
        size / sizeof(struct sock_filter) > BPF_MAXINSNS)
        return NULL;
    struct sock_filter *filter = malloc(size);
    if (!filter || read(fd, filter, size) != (ssize_t)size)
        return NULL;
    close(fd);
    *length = (unsigned short)(size / sizeof(struct sock_filter));
    return filter;
}

/* reference run FILE COMMAND */
static int run_measured(const char *file, const char *command) {
    char *const argv[] = {"/bin/sh", "-c", (char *)command, NULL};
    pid_t child;
    int status = 0;
    if (posix_spawn(&child, "/bin/sh", NULL, NULL, argv, environ) != 0)
        return 127;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR)
            return 127;
    struct rusage usage;
    getrusage(RUSAGE_CHILDREN, &usage);
    long long us = (long long)(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000LL +
                   usage.ru_utime.tv_usec + usage.ru_stime.tv_usec;
    FILE *out = fopen(file, "a");
    if (out) {
        fprintf(out, "%lld\n", us);
        fclose(out);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "run") == 0)
        return run_measured(argv[2], argv[3]);
    if (argc < 4)
        return usage();
    bool spawning = strcmp(argv[1], "spawn") == 0;
    if (!spawning && (strcmp(argv[1], "trajectory") != 0 || argc != 6))
        return usage();
    int workers = atoi(argv[2]);
    double seconds = atof(argv[3]);
    if (workers < 1 || workers > MAX_WORKERS || !(seconds > 0))
        return usage();
    trajectory_plan plan = {0};
    if (!spawning) {
        plan.filter = read_filter(argv[4], &plan.length);
        if (!plan.filter) {
            fprintf(stderr, "reference: cannot read a BPF program from %s\n", argv[4]);
            return 1;
        }
        plan.uid_base = (unsigned)strtoul(argv[5], NULL, 10);
    }
    shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        perror("reference: mmap");
        return 1;
    }
    double started = now(), stop_at = started + seconds;
    pid_t pids[MAX_WORKERS];
    for (int worker = 0; worker < workers; worker++) {
        pids[worker] = fork();
        if (pids[worker] < 0) {
            perror("reference: fork");
            return 1;
        }
        if (pids[worker] == 0) {
            while (!shared->failed && now() < stop_at) {
                double one = now();
                if (spawning) {
                    spawn_true();
                    record(worker, now() - one);
                } else {
                    trajectory(worker, &plan);
                }
                shared->count[worker]++;
            }
            _exit(0);
        }
    }
    for (int worker = 0; worker < workers; worker++)
        waitpid(pids[worker], NULL, 0);
    double elapsed = now() - started;
    if (shared->failed) {
        fprintf(stderr, "reference %s failed: %s\n", argv[1], shared->error);
        return 1;
    }
    long count = 0, samples = 0;
    for (int worker = 0; worker < workers; worker++) {
        count += shared->count[worker];
        samples += shared->samples[worker];
    }
    double *all = malloc(sizeof(double) * (size_t)(samples ? samples : 1));
    long at = 0;
    for (int worker = 0; worker < workers; worker++)
        for (long i = 0; i < shared->samples[worker]; i++)
            all[at++] = shared->sample[worker][i];
    qsort(all, (size_t)samples, sizeof(double), compare);
    double p50 = samples ? all[samples / 2] : 0, p99 = samples ? all[samples * 99 / 100] : 0;
    printf("{\"count\": %ld, \"seconds\": %.6f, \"p50_s\": %.9f, \"p99_s\": %.9f}\n", count,
           elapsed, p50, p99);
    return 0;
}
