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
 *   reference isolated WORKERS SECONDS FILTER_FILE UID_BASE CONTROLS
 *       (a) with some or all of a lease's controls, to show what each costs the kernel: WORKERS
 *       processes, each entering the controls once (as a lease does once for all its calls) and
 *       then spawning "/bin/sh -c true" in a loop. CONTROLS is "none" or a comma-separated list:
 *         agent       spawn as the compiled lease agent does (slot_helper.c, run_exec): stdout
 *                     and stderr into two fresh pipes read to their end, stdin from /dev/null,
 *                     SIGPIPE and SIGXFSZ to their defaults, no signal blocked, a new process
 *                     group; then waitpid
 *         setsid      the spawn makes a new session (POSIX_SPAWN_SETSID), where the agent makes
 *                     one; with kernel.sched_autogroup_enabled=1 each is a new scheduler
 *                     autogroup
 *         nice        the command made 10 nicer than its spawner (setpriority after the spawn)
 *         filter      no_new_privs and the seccomp filter read from FILTER_FILE
 *         namespaces  the slot uid (UID_BASE + worker, when root) and new user, mount, pid, ipc,
 *                     uts and network namespaces with loopback up and a fresh /proc, as in
 *                     trajectory; the spawner is pid 1 of the new pid namespace
 *         nested      a second level of them inside the first (a lease is a pid namespace
 *                     inside its slot's bubblewrap sandbox, whose --disable-userns nests a user
 *                     namespace); needs namespaces
 *       (a'), the all-core spawn limit inside a lease's isolation, is all of them (setsid only
 *       where the agent's spawn sets it: bench/reference.py reads which).
 *
 *   reference run FILE COMMAND
 *       Runs "/bin/sh -c COMMAND" (its output is this program's), waits for it and appends the
 *       CPU it and everything it reaped used, in microseconds, as one line to FILE; exits with
 *       its status. How bench/agent_mix.py counts a command's own CPU inside a sandbox.
 *
 * spawn, isolated and trajectory print one line of JSON: {"count": N, "seconds": S, "p50_s": X,
 * "p99_s": Y, "cpu_s": C}, where the quantiles are of one spawn (spawn, isolated) or of one
 * trajectory's set-up before its first command (trajectory), and C is the user and system CPU
 * of every process the run started (getrusage of its reaped children: workers, their
 * namespaces' pid 1s and every "sh"). A failure prints what failed and exits 1: no partial
 * figure passes for a measurement. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
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

/* Wait for ``child``; fail naming ``what`` unless it exited 0. */
static void reap_ok(pid_t child, const char *what) {
    int status = 0;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR)
            fail("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        errno = 0;
        fail(what);
    }
}

/* One "/bin/sh -c true", waited for. */
static void spawn_true(void) {
    static char *const argv[] = {"/bin/sh", "-c", "true", NULL};
    pid_t child;
    errno = posix_spawn(&child, "/bin/sh", NULL, NULL, argv, environ);
    if (errno != 0)
        fail("posix_spawn /bin/sh");
    reap_ok(child, "/bin/sh -c true did not exit 0");
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

/* The slot's own uid, never root (when run as root): UID_BASE + worker. */
static void switch_to_slot_uid(int worker, unsigned uid_base) {
    if (geteuid() != 0)
        return;
    unsigned id = uid_base + (unsigned)worker;
    if (setgroups(0, NULL) != 0 || setresgid(id, id, id) != 0 || setresuid(id, id, id) != 0)
        fail("switch to the slot uid");
    (void)prctl(PR_SET_DUMPABLE, 1, 0, 0, 0); /* its own /proc/self, to write the maps */
}

/* New user, mount, pid, ipc, uts and network namespaces (the uid and gid mapped to themselves,
 * as bubblewrap does; loopback up), then a fork: the child is pid 1 of the new pid namespace,
 * mounts a fresh /proc and returns; the caller waits for it and exits with its status. */
static void enter_namespaces(void) {
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
    pid_t first = fork();
    if (first < 0)
        fail("fork into the pid namespace");
    if (first == 0) {
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
            fail("mount / private");
        if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
            fail("mount /proc");
        return;
    }
    int status = 0;
    while (waitpid(first, &status, 0) < 0)
        if (errno != EINTR)
            fail("waitpid");
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

static void install_filter(const trajectory_plan *plan) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        fail("no_new_privs");
    struct sock_fprog program = {plan->length, plan->filter};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0) != 0)
        fail("seccomp");
}

/* One trajectory, from the worker's fork to its last command's end. */
static void trajectory(int worker, const trajectory_plan *plan) {
    double started = now();
    pid_t outer = fork();
    if (outer < 0)
        fail("fork");
    if (outer == 0) {
        switch_to_slot_uid(worker, plan->uid_base);
        enter_namespaces(); /* returns in pid 1 of the trajectory's pid namespace */
        install_filter(plan);
        record(worker, now() - started);
        for (int i = 0; i < SPAWNS_PER_TRAJECTORY; i++)
            spawn_true();
        _exit(0);
    }
    reap_ok(outer, "a trajectory failed");
}

/* ------------------------------------------------------------------ isolated: (a) + controls */

enum {
    AGENT = 1 << 0,
    SETSID = 1 << 1,
    NICER = 1 << 2,
    FILTER = 1 << 3,
    NAMESPACES = 1 << 4,
    NESTED = 1 << 5,
};
static const struct {
    const char *name;
    unsigned bit;
} CONTROLS[] = {{"agent", AGENT},   {"setsid", SETSID},         {"nice", NICER},
                {"filter", FILTER}, {"namespaces", NAMESPACES}, {"nested", NESTED}};
/* slot_helper.c's COMMAND_NICENESS */
static const int COMMAND_NICENESS = 10;

/* CONTROLS as bits; false when a name is unknown or nested comes without namespaces. */
static bool parse_controls(const char *text, unsigned *bits) {
    *bits = 0;
    if (strcmp(text, "none") == 0)
        return true;
    char copy[256];
    if (snprintf(copy, sizeof copy, "%s", text) >= (int)sizeof copy)
        return false;
    for (char *rest = copy, *name; (name = strsep(&rest, ",")) != NULL;) {
        bool known = false; /* an empty name (",,", a trailing comma, "") is none of them */
        for (size_t i = 0; i < sizeof CONTROLS / sizeof *CONTROLS; i++)
            if (strcmp(name, CONTROLS[i].name) == 0) {
                *bits |= CONTROLS[i].bit;
                known = true;
            }
        if (!known)
            return false;
    }
    return !(*bits & NESTED) || (*bits & NAMESPACES);
}

typedef struct {
    unsigned controls;
    int nicer; /* the commands' nice value (NICER) */
    int out_fd, err_fd; /* the pipes' write ends the kept file actions name (AGENT) */
    bool kept;
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attributes;
} spawner;

/* The file actions and attributes of the agent's spawn (slot_helper.c, spawn_setup_for), made
 * once and kept while the pipes come back at the same descriptors, as the agent keeps them. */
static void spawner_ready(spawner *s, int out_fd, int err_fd) {
    if (s->kept && s->out_fd == out_fd && s->err_fd == err_fd)
        return;
    if (s->kept) {
        posix_spawn_file_actions_destroy(&s->actions);
        posix_spawnattr_destroy(&s->attributes);
    }
    bool agent = s->controls & AGENT, own_session = s->controls & SETSID;
    short flags = own_session ? POSIX_SPAWN_SETSID : 0;
    if ((errno = posix_spawn_file_actions_init(&s->actions)) != 0 ||
        (errno = posix_spawnattr_init(&s->attributes)) != 0)
        fail("posix_spawn set-up");
    if (agent) {
        sigset_t defaults, none;
        sigemptyset(&defaults);
        sigaddset(&defaults, SIGPIPE);
        sigaddset(&defaults, SIGXFSZ);
        sigemptyset(&none);
        if ((errno = posix_spawn_file_actions_addopen(&s->actions, 0, "/dev/null", O_RDONLY,
                                                      0)) != 0 ||
            (errno = posix_spawn_file_actions_adddup2(&s->actions, out_fd, 1)) != 0 ||
            (errno = posix_spawn_file_actions_adddup2(&s->actions, err_fd, 2)) != 0 ||
            (errno = posix_spawnattr_setsigdefault(&s->attributes, &defaults)) != 0 ||
            (errno = posix_spawnattr_setsigmask(&s->attributes, &none)) != 0 ||
            (errno = own_session ? 0 : posix_spawnattr_setpgroup(&s->attributes, 0)) != 0)
            fail("posix_spawn set-up");
        flags |= (short)((own_session ? 0 : POSIX_SPAWN_SETPGROUP) | POSIX_SPAWN_SETSIGDEF |
                         POSIX_SPAWN_SETSIGMASK);
    }
    if ((errno = posix_spawnattr_setflags(&s->attributes, flags)) != 0)
        fail("posix_spawn set-up");
    s->out_fd = out_fd;
    s->err_fd = err_fd;
    s->kept = true;
}

/* Read both pipes to their end (the agent's capture, less its bookkeeping). */
static void drain(int out_fd, int err_fd) {
    struct pollfd watched[2] = {{.fd = out_fd, .events = POLLIN}, {.fd = err_fd, .events = POLLIN}};
    char chunk[4096];
    int open_pipes = 2;
    while (open_pipes) {
        if (poll(watched, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            fail("poll");
        }
        for (int i = 0; i < 2; i++) {
            if (watched[i].fd < 0 || !watched[i].revents)
                continue;
            ssize_t got = read(watched[i].fd, chunk, sizeof chunk);
            if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
                close(watched[i].fd);
                watched[i].fd = -1;
                open_pipes--;
            }
        }
    }
}

/* One "/bin/sh -c true" as the controls say, waited for. */
static void spawn_controlled(spawner *s) {
    static char *const argv[] = {"/bin/sh", "-c", "true", NULL};
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (s->controls & AGENT) {
        if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)
            fail("pipe2");
    }
    spawner_ready(s, out_pipe[1], err_pipe[1]);
    pid_t child;
    errno = posix_spawn(&child, "/bin/sh", &s->actions, &s->attributes, argv, environ);
    if (errno != 0)
        fail("posix_spawn /bin/sh");
    if (s->controls & NICER)
        (void)setpriority(PRIO_PROCESS, (id_t)child, s->nicer);
    if (s->controls & AGENT) {
        close(out_pipe[1]);
        close(err_pipe[1]);
        drain(out_pipe[0], err_pipe[0]);
    }
    reap_ok(child, "/bin/sh -c true did not exit 0");
}

/* One worker of isolated: enter the controls once, then spawn until ``stop_at``. */
static void isolated_worker(int worker, const trajectory_plan *plan, unsigned controls,
                            double stop_at) {
    if (controls & NAMESPACES) {
        switch_to_slot_uid(worker, plan->uid_base);
        enter_namespaces();
        if (controls & NESTED)
            enter_namespaces();
    }
    if (controls & FILTER)
        install_filter(plan);
    spawner s = {.controls = controls};
    errno = 0;
    int own = getpriority(PRIO_PROCESS, 0);
    if (errno)
        fail("getpriority");
    s.nicer = own + COMMAND_NICENESS < 19 ? own + COMMAND_NICENESS : 19;
    while (!shared->failed && now() < stop_at) {
        double one = now();
        spawn_controlled(&s);
        record(worker, now() - one);
        shared->count[worker]++;
    }
    _exit(0);
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int usage(void) {
    fprintf(stderr, "usage: reference spawn WORKERS SECONDS\n"
                    "       reference trajectory WORKERS SECONDS FILTER_FILE UID_BASE\n"
                    "       reference isolated WORKERS SECONDS FILTER_FILE UID_BASE CONTROLS\n"
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
    bool spawning = strcmp(argv[1], "spawn") == 0 && argc == 4;
    bool isolating = strcmp(argv[1], "isolated") == 0 && argc == 7;
    if (!spawning && !isolating && (strcmp(argv[1], "trajectory") != 0 || argc != 6))
        return usage();
    unsigned controls = 0;
    if (isolating && !parse_controls(argv[6], &controls)) {
        fprintf(stderr, "reference: CONTROLS is \"none\" or a comma-separated list of agent, "
                        "setsid, nice, filter, namespaces, nested (nested with namespaces), "
                        "not %s\n", argv[6]);
        return 2;
    }
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
                if (isolating) {
                    isolated_worker(worker, &plan, controls, stop_at);
                } else if (spawning) {
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
    struct rusage children;
    getrusage(RUSAGE_CHILDREN, &children);
    double cpu = (double)(children.ru_utime.tv_sec + children.ru_stime.tv_sec) +
                 (double)(children.ru_utime.tv_usec + children.ru_stime.tv_usec) * 1e-6;
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
    printf("{\"count\": %ld, \"seconds\": %.6f, \"p50_s\": %.9f, \"p99_s\": %.9f, "
           "\"cpu_s\": %.6f}\n",
           count, elapsed, p50, p99, cpu);
    return 0;
}
