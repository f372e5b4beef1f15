/*
 * trajcore's slot helper: a slot's keeper and its leases' agents, in one program. It is the only
 * implementation of every lease step; docs/sandbox.md ("The slot helper and its protocol") is the
 * reference for its roles, its command lines and its two protocols. A slot server takes it from
 * the install (wheels and images ship it) or builds it once with the host's C compiler
 * (native_helper.py), and does not start without it.
 *
 *   slot-helper keep --workspace W --state-dir S --tmp T [--limit NAME VALUE]...
 *                    [--carry-rw PATH]... [--carry-ro PATH]... [--mask PATH]...
 *                    [--read-only PATH]... [--tmpfs-options OPTIONS] [--own-network]
 *                    [--seccomp HEX] [--command-nproc N]
 *
 * The keeper: the first program of a slot's bubblewrap sandbox. Requests on fd 0
 * (SOCK_SEQPACKET): "lease" (with the lease's channel as an SCM_RIGHTS descriptor), "end" or
 * "ready" (ready the next lease's first process while idle). A lease is a clone into fresh namespaces that drops every capability, sets its limits,
 * installs the --seccomp filter last and only then serves the lease on fd 3.
 *
 *   slot-helper serve CHANNEL_FD STATE_DIR WORKSPACE TMUX_PATH_OR_EMPTY
 *
 * The agent alone, on an existing channel (what each lease runs after its setup).
 *
 *   slot-helper bare --workspace W --state-dir S [--limit NAME VALUE]... [--command-nproc N]
 *
 * An unsandboxed slot's agent (no bubblewrap on the host), serving on fd 0: it enters W, sets
 * the limits, looks tmux up on PATH, and keeps each command in its own session (a new process
 * group of it), so the slot server can end everything a lease left by that session.
 *
 *   slot-helper userns COUNT
 *
 * COUNT processes, each in a new user namespace with no ids mapped, for the slot server (root)
 * to map and hold by descriptor: an idmapped mount takes one (workspace_overlays.py, idmaps.py).
 * Prints their pids on one line once every one is in its namespace; each ends when its stdin
 * reaches its end (the server closes it once it holds the namespaces).
 *
 * Agent requests, each field a 4-byte big-endian length and its bytes, the op first:
 *
 *   exec      TIMEOUT CAP ARGV0 [ARGV1 ...]
 *   verify    TIMEOUT CAP ARGV0 [ARGV1 ...]   (exec for the env's hooks: the process reserve)
 *   stateful  TIMEOUT CAP COMMAND
 *   tmux      TIMEOUT LITERAL ENTER WAIT LINES KEY [KEY ...]   (LITERAL, ENTER: "0" or "1")
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum {
    HEADER_SIZE = 4,
    READ_CHUNK = 1 << 16,
    TMUX_CAP = 1 << 20,
    MAX_REQUEST = 16 << 20, /* runtime.MAX_REQUEST_BYTES: anything larger ends the lease */
};
static const double DRAIN_AFTER_EXIT_S = 0.05;
/* The persistent shell keeps to its call's TIMEOUT: each tmux command gets the time the call has
 * left. Past it, the steps that end the call (Ctrl-C, a capture of the pane) get TMUX_LATE_S each,
 * and the shell SHELL_SETTLE_S to be back at its prompt after Ctrl-C (a test runner or a package
 * installer cleans up for a while), else it is killed: a call answers within about three seconds
 * of its TIMEOUT, inside the slot server's grace (agent_grace_s, 5 s). */
static const double TMUX_LATE_S = 0.5;
static const double SHELL_SETTLE_S = 2.0;
/* How long a call waits for the shell to be at its prompt before it types (a shell on its way
 * back from the last command takes milliseconds; one busy with a program takes the keys late). */
static const double PROMPT_WAIT_S = 1.0;
/* A command runs this much nicer than its agent (and so than the slot server and its keepers,
 * which run at the agent's nice value): when a host's cores are busy with commands, the server's
 * readying of the next lease and its answers wait behind them less. A lease cannot undo it
 * (RLIMIT_NICE is 0), and a command's own children inherit it. */
static const int COMMAND_NICENESS = 10;

/* ------------------------------------------------------------------------------ buffers */

typedef struct {
    char *data;
    size_t len, cap;
} buf;

static void out_of_memory(void) {
    /* The slot server sees the channel close and reports the lease lost. */
    static const char message[] = "slot-lease: out of memory\n";
    (void)!write(2, message, sizeof message - 1);
    _exit(1);
}

static void buf_reserve(buf *b, size_t more) {
    if (b->len + more <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more)
        cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data)
        out_of_memory();
    b->data = data;
    b->cap = cap;
}

static void buf_put(buf *b, const void *data, size_t n) {
    if (!n)
        return;
    buf_reserve(b, n);
    memcpy(b->data + b->len, data, n);
    b->len += n;
}

static void buf_puts(buf *b, const char *text) { buf_put(b, text, strlen(text)); }

static void buf_printf(buf *b, const char *format, ...) {
    va_list args;
    va_start(args, format);
    int n = vsnprintf(NULL, 0, format, args);
    va_end(args);
    if (n < 0)
        return;
    buf_reserve(b, (size_t)n + 1);
    va_start(args, format);
    vsnprintf(b->data + b->len, (size_t)n + 1, format, args);
    va_end(args);
    b->len += (size_t)n;
}

static void buf_free(buf *b) {
    free(b->data);
    *b = (buf){0};
}

/* ------------------------------------------------------------------------------ JSON */

/* Length of the well-formed UTF-8 sequence at s[0..n), or 0 when it is ill-formed; *bad is then
 * the length of its maximal ill-formed subpart (at least 1), which becomes one U+FFFD. */
static size_t utf8_sequence(const unsigned char *s, size_t n, size_t *bad) {
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t i = 1; i < need; i++) {
        unsigned char low = i == 1 ? lo : 0x80, high = i == 1 ? hi : 0xBF;
        if (i >= n || s[i] < low || s[i] > high) {
            *bad = i;
            return 0;
        }
    }
    return need;
}

/* ``text`` as a JSON string: quote, backslash and control characters escaped (\b \t \n \f \r
 * by name, the rest as \u00XX), ill-formed UTF-8 replaced with U+FFFD as Python's
 * ``bytes.decode("utf-8", "replace")`` does. */
static void json_string(buf *out, const char *text, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)text;
    buf_reserve(out, n + 2);
    buf_put(out, "\"", 1);
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c >= 0x80) {
            size_t bad = 0, good = utf8_sequence(s + i, n - i, &bad);
            if (good) {
                buf_put(out, s + i, good);
                i += good;
            } else {
                buf_put(out, "\xEF\xBF\xBD", 3);
                i += bad;
            }
            continue;
        }
        i++;
        switch (c) {
        case '"': buf_put(out, "\\\"", 2); break;
        case '\\': buf_put(out, "\\\\", 2); break;
        case '\b': buf_put(out, "\\b", 2); break;
        case '\t': buf_put(out, "\\t", 2); break;
        case '\n': buf_put(out, "\\n", 2); break;
        case '\f': buf_put(out, "\\f", 2); break;
        case '\r': buf_put(out, "\\r", 2); break;
        default:
            if (c < 0x20) {
                char escape[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
                buf_put(out, escape, sizeof escape);
            } else {
                buf_put(out, &c, 1);
            }
        }
    }
    buf_put(out, "\"", 1);
}

/* ------------------------------------------------------------------------------ results */

typedef struct {
    bool failed;     /* the call could not run: only ``error`` is meaningful */
    buf error;       /* why */
    const char *code; /* with ``failed``: the reason as a code (``REPLY_NO_TMUX``), else NULL */
    bool has_exit;   /* "exit" is a number (else null) */
    int exit_code;
    bool has_signal; /* "signal" is a number (else null) */
    int signal;
    buf out, err; /* raw bytes, with the "dropped" marker in place; replaced when written */
    long long out_dropped, err_dropped;
    bool timed_out;
    double duration;
} result;

/* An error reply's ``code`` (docs/sandbox.md, "The agent protocol"): the server decides on it,
 * never on the error's text. The persistent shell's tools cannot run: the lease's root has no
 * tmux. */
static const char REPLY_NO_TMUX[] = "no_tmux";

static void result_free(result *r) {
    buf_free(&r->error);
    buf_free(&r->out);
    buf_free(&r->err);
}

static void fail(result *r, const char *format, ...) {
    va_list args;
    va_start(args, format);
    char text[1024];
    vsnprintf(text, sizeof text, format, args);
    va_end(args);
    r->failed = true;
    r->code = NULL;
    r->error.len = 0;
    buf_puts(&r->error, text);
}

static void write_result(buf *out, const result *r) {
    if (r->failed) {
        buf_puts(out, "{\"exit\":null,\"error\":");
        json_string(out, r->error.data, r->error.len);
        if (r->code)
            buf_printf(out, ",\"code\":\"%s\"", r->code);
        buf_puts(out, "}");
        return;
    }
    buf_puts(out, "{\"exit\":");
    if (r->has_exit)
        buf_printf(out, "%d", r->exit_code);
    else
        buf_puts(out, "null");
    buf_puts(out, ",\"signal\":");
    if (r->has_signal)
        buf_printf(out, "%d", r->signal);
    else
        buf_puts(out, "null");
    buf_puts(out, ",\"stdout\":");
    json_string(out, r->out.data, r->out.len);
    buf_puts(out, ",\"stderr\":");
    json_string(out, r->err.data, r->err.len);
    buf_printf(out, ",\"stdout_dropped\":%lld,\"stderr_dropped\":%lld,\"timed_out\":%s",
               r->out_dropped, r->err_dropped, r->timed_out ? "true" : "false");
    buf_printf(out, ",\"duration\":%.17g}", r->duration);
}

/* ------------------------------------------------------------------------------ helpers */

static double monotonic(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

static void pause_for(double seconds) {
    if (!(seconds > 0))
        return;
    if (seconds > 1e6)
        seconds = 1e6;
    struct timespec wait = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&wait, &wait) != 0 && errno == EINTR) {
    }
}

static bool exists(const char *path) {
    struct stat info;
    return stat(path, &info) == 0;
}

/* ``mkdir -p path`` (mode 0755); errors are left for the first use of the directory to find. */
static void make_dirs(const char *path) {
    char partial[PATH_MAX];
    size_t n = strlen(path);
    if (n >= sizeof partial)
        return;
    memcpy(partial, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (partial[i] == '/' || partial[i] == '\0') {
            char kept = partial[i];
            partial[i] = '\0';
            if (!exists(partial))
                (void)mkdir(partial, 0755);
            partial[i] = kept;
        }
    }
}

/* The first executable ``name`` on PATH, into ``found``; false when there is none. */
static bool which(const char *name, char *found, size_t size) {
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/bin:/bin";
    while (true) {
        const char *end = strchr(path, ':');
        size_t length = end ? (size_t)(end - path) : strlen(path);
        /* absolute entries only: an empty or relative one (an image's PATH may hold one) names
         * the workspace, where the model could put a program the helper would run for itself */
        int written = length && path[0] == '/'
                          ? snprintf(found, size, "%.*s/%s", (int)length, path, name)
                          : -1;
        if (written > 0 && (size_t)written < size && access(found, X_OK) == 0 && exists(found))
            return true;
        if (!end)
            return false;
        path = end + 1;
    }
}

static void kill_group(pid_t group) { (void)killpg(group, SIGKILL); }

static pid_t wait_for_child(pid_t pid, int *status) {
    pid_t done;
    while ((done = waitpid(pid, status, 0)) < 0 && errno == EINTR) {
    }
    return done;
}

/* ------------------------------------------------------------------------------ capture */

/* One output stream: keeps the first and last cap/2 bytes, counts what falls between. */
typedef struct {
    size_t head_cap, tail_cap;
    buf head, tail;
    long long total;
} capture;

static void capture_init(capture *c, size_t cap) {
    *c = (capture){.head_cap = cap / 2, .tail_cap = cap - cap / 2};
}

static void capture_feed(capture *c, const char *data, size_t n) {
    c->total += (long long)n;
    if (c->head.len < c->head_cap) {
        size_t take = c->head_cap - c->head.len;
        if (take > n)
            take = n;
        buf_put(&c->head, data, take);
        data += take;
        n -= take;
    }
    if (n) {
        buf_put(&c->tail, data, n);
        if (c->tail.len > 2 * c->tail_cap + READ_CHUNK) {
            memmove(c->tail.data, c->tail.data + c->tail.len - c->tail_cap, c->tail_cap);
            c->tail.len = c->tail_cap;
        }
    }
}

/* The kept bytes, with a marker where bytes were dropped, into ``text``; returns how many
 * were dropped. Frees the capture. */
static long long capture_finish(capture *c, buf *text) {
    if (c->tail.len > c->tail_cap) {
        memmove(c->tail.data, c->tail.data + c->tail.len - c->tail_cap, c->tail_cap);
        c->tail.len = c->tail_cap;
    }
    long long dropped = c->total - (long long)c->head.len - (long long)c->tail.len;
    text->len = 0;
    buf_put(text, c->head.data, c->head.len);
    if (dropped)
        buf_printf(text, "\n[... %lld bytes dropped ...]\n", dropped);
    buf_put(text, c->tail.data, c->tail.len);
    buf_free(&c->head);
    buf_free(&c->tail);
    return dropped;
}

/* ------------------------------------------------------------------------------ exec */

static int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

static void set_status(result *r, int status) {
    r->has_exit = WIFEXITED(status);
    r->exit_code = r->has_exit ? WEXITSTATUS(status) : 0;
    r->has_signal = WIFSIGNALED(status);
    r->signal = r->has_signal ? WTERMSIG(status) : 0;
}

/* How long a command may run before the agent watches its process (a pidfd) besides its pipes.
 * A short command (``ls``, ``cat``, ``true``) closes its pipes by exiting well before: then one
 * ``waitpid(WNOHANG)`` at the end of its output reaps it, with no descriptor opened for it. A
 * command that exits sooner while something it left in the background holds its pipes is seen
 * to have exited at this age at the latest (its output then drains for DRAIN_AFTER_EXIT_S). */
static const double WATCH_PROCESS_AFTER_S = 0.01;

/* A command's start: a clone that shares the agent's memory and runs on its own stack, with the
 * agent suspended until it has exec'd or failed (CLONE_VM | CLONE_VFORK, as posix_spawn does).
 * The child sets up everything a command starts with, on itself, before its first instruction:
 * stdin from /dev/null, stdout and stderr on the pipes, a new session (``own_session``) or a new
 * process group, SIGPIPE and SIGXFSZ back to their defaults and no signal blocked, its nice
 * value (``nice``, when it is not INT_MAX) and its RLIMIT_NPROC (``nproc``, soft and hard)
 * when it is not RLIM_INFINITY. Rlimits are per
 * process, so what the child sets is its own, never the agent's. An error of the child (its errno) comes back in ``error`` (shared memory). */
typedef struct {
    char *const *argv;
    int out_fd, err_fd;
    bool own_session;
    rlim_t nproc; /* RLIM_INFINITY: inherited */
    int nice;     /* INT_MAX: inherited */
    volatile int error;
} spawn_plan;

/* The clone's stack: the agent is one thread and suspended while its child uses it. */
static char spawn_stack[64 * 1024] __attribute__((aligned(16)));

/* The child of ``spawn_command``: async-signal-safe calls only (it runs in the agent's memory).
 * The agent handles no signal (SIGPIPE and SIGXFSZ ignored, the rest default), so no handler of
 * its can run here; every signal is blocked until the mask is emptied just before the exec. */
static int spawn_child(void *arg) {
    spawn_plan *p = arg;
    struct sigaction defaults = {.sa_handler = SIG_DFL};
    sigset_t none;
    sigemptyset(&none);
    int fd;
    if (sigaction(SIGPIPE, &defaults, NULL) != 0 || sigaction(SIGXFSZ, &defaults, NULL) != 0 ||
        (p->own_session ? setsid() < 0 : setpgid(0, 0) != 0) ||
        (fd = open("/dev/null", O_RDONLY)) < 0 || (fd != 0 && (dup2(fd, 0) < 0 || close(fd))) ||
        (p->out_fd == 1 ? fcntl(1, F_SETFD, 0) : dup2(p->out_fd, 1)) < 0 ||
        (p->err_fd == 2 ? fcntl(2, F_SETFD, 0) : dup2(p->err_fd, 2)) < 0)
        goto failed;
    if (p->nproc != RLIM_INFINITY) {
        /* at most the hard limit it has: one the model lowered on its agent (``prlimit --pid
         * 1``, its own uid may) binds its later commands, never stops them from starting */
        struct rlimit limit = {p->nproc, p->nproc}, own;
        if (getrlimit(RLIMIT_NPROC, &own) == 0 && own.rlim_max < limit.rlim_max)
            limit.rlim_cur = limit.rlim_max = own.rlim_max;
        if (setrlimit(RLIMIT_NPROC, &limit) != 0)
            goto failed;
    }
    if (p->nice != INT_MAX) /* as before, a nice value it cannot take leaves it as it is */
        (void)setpriority(PRIO_PROCESS, 0, p->nice);
    if (sigprocmask(SIG_SETMASK, &none, NULL) != 0)
        goto failed;
    execve(p->argv[0], p->argv, environ);
failed:
    p->error = errno ? errno : EINVAL;
    _exit(127);
}

/* Start ``p->argv`` (its first element a path, not looked up); 0 and its pid in ``pid``, or
 * the error number (the child's, reaped, when it could not exec). */
static int spawn_command(spawn_plan *p, pid_t *pid) {
    sigset_t all, before;
    sigfillset(&all);
    p->error = 0;
    if (sigprocmask(SIG_SETMASK, &all, &before) != 0)
        return errno;
    pid_t child = clone(spawn_child, spawn_stack + sizeof spawn_stack,
                        CLONE_VM | CLONE_VFORK | SIGCHLD, p);
    int failed = child < 0 ? errno : 0;
    (void)sigprocmask(SIG_SETMASK, &before, NULL);
    if (failed)
        return failed;
    if (p->error) { /* it has exited already (the agent resumes only then, or at its exec) */
        wait_for_child(child, NULL);
        return p->error;
    }
    *pid = child;
    return 0;
}

/* How often a command's wait reaps the lease's ended orphans once the command is watched. */
static const double REAP_EVERY_S = 0.05;

/* As its namespace's pid 1 the agent inherits every orphan of the lease; reap those that ended
 * while ``command`` runs, so they hold no process slot (pids.max counts the dead until they are
 * reaped) and a command that retries a fork the limit refused gets it once they end. Each
 * ended child is looked at first (WNOWAIT) and reaped by its pid only when it is not
 * ``command``, whose status its own wait reads; the look stops at it. */
static void reap_orphans_but(pid_t command) {
    while (true) {
        siginfo_t ended = {0};
        if (waitid(P_ALL, 0, &ended, WEXITED | WNOHANG | WNOWAIT) != 0 || ended.si_pid <= 0 ||
            ended.si_pid == command || waitpid(ended.si_pid, NULL, WNOHANG) <= 0)
            return;
    }
}

/* Run ``argv`` in a new session (``own_session``; else a new process group of this session),
 * stdin from /dev/null, stdout and stderr captured up to ``cap`` bytes each; kill its process
 * group at ``timeout`` seconds.
 *
 * Only the two pipes are watched at first. At the end of both, one ``waitpid(WNOHANG)`` reaps a
 * command that has exited (most: the kernel ends an exiting process's pipes a little before it
 * makes it a zombie, so the look is now and then too early); the process itself is watched (a
 * pidfd; without one, ``waitpid`` every 10 ms) only when it still runs then, or once it is
 * WATCH_PROCESS_AFTER_S old: a command that closed its pipes but runs on, and one whose
 * background processes hold its pipes after it exited. While it is watched, the lease's ended
 * orphans are reaped every REAP_EVERY_S at most (reap_orphans_but). */
/* The process reserve of the env's hooks (``--command-nproc N``, docs/sandbox.md): every command
 * starts with RLIMIT_NPROC N (soft and hard), which leaves the lease's own process limit (its
 * cgroup's pids.max, or the agent's RLIMIT_NPROC) a reserve that only a ``verify`` request's
 * command (and what it starts) may use. The agent keeps its hard limit and holds its soft one
 * at N between spawns, so the kernel refuses a command's start once the commands' processes
 * hold N; the child of the spawn sets its own limit to N, soft and hard, before it execs, so a
 * command holds N from its first instruction on and nothing it runs can raise it (a fork loop,
 * or a program that raises its soft limit first thing, never takes the reserve).
 * ``command_nproc`` RLIM_INFINITY: no reserve. */
static rlim_t command_nproc = RLIM_INFINITY;
static rlim_t agent_nproc_hard = RLIM_INFINITY;

/* Hold the agent's soft RLIMIT_NPROC at the commands' limit (at most its hard one). */
static void hold_command_nproc(void) {
    struct rlimit own;
    if (command_nproc == RLIM_INFINITY || getrlimit(RLIMIT_NPROC, &own) != 0)
        return;
    agent_nproc_hard = own.rlim_max;
    own.rlim_cur = command_nproc < own.rlim_max ? command_nproc : own.rlim_max;
    (void)setrlimit(RLIMIT_NPROC, &own);
}

/* Around a spawn: a reserved one runs with the agent's whole limit (``open``), then the agent
 * goes back to the commands' one. */
static void open_reserve(bool open) {
    if (command_nproc == RLIM_INFINITY)
        return;
    struct rlimit own = {open ? agent_nproc_hard
                              : (command_nproc < agent_nproc_hard ? command_nproc : agent_nproc_hard),
                         agent_nproc_hard};
    (void)setrlimit(RLIMIT_NPROC, &own);
}

static void run_command(char *const argv[], double timeout, size_t cap, bool own_session,
                        bool reserved, result *r) {
    double started = monotonic();
    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0) {
        fail(r, "cannot start %s: %s", argv[0], strerror(errno));
        return;
    }
    if (pipe2(err_pipe, O_CLOEXEC) != 0) {
        fail(r, "cannot start %s: %s", argv[0], strerror(errno));
        close(out_pipe[0]);
        close(out_pipe[1]);
        return;
    }
    /* A command of the model's gets the commands' limit, set by its own process before it
     * execs (not from here once it runs: a command that raised its soft limit at once could
     * fork before that); a reserved one inherits the whole limit the agent opens for it. */
    spawn_plan plan = {
        .argv = argv,
        .out_fd = out_pipe[1],
        .err_fd = err_pipe[1],
        .own_session = own_session,
        .nproc = reserved || command_nproc == RLIM_INFINITY ? RLIM_INFINITY
                 : command_nproc < agent_nproc_hard         ? command_nproc
                                                            : agent_nproc_hard,
    };
    /* the nice value too is the child's own before it execs (set from here once it runs, a
     * child the command forked at once kept the agent's) */
    static int nicer = INT_MIN; /* this process's nice value never changes: read it once */
    if (nicer == INT_MIN) {
        errno = 0;
        int own = getpriority(PRIO_PROCESS, 0);
        if (errno)
            nicer = INT_MAX; /* unreadable: left as it is */
        else /* at most 19, the kernel's highest */
            nicer = own + COMMAND_NICENESS < 19 ? own + COMMAND_NICENESS : 19;
    }
    plan.nice = nicer;
    pid_t pid = 0;
    if (reserved)
        open_reserve(true);
    int spawned = spawn_command(&plan, &pid);
    if (reserved)
        open_reserve(false);
    close(out_pipe[1]);
    close(err_pipe[1]);
    if (spawned != 0) {
        fail(r, "cannot start %s: %s", argv[0], strerror(spawned));
        close(out_pipe[0]);
        close(err_pipe[0]);
        return;
    }

    capture captures[2];
    capture_init(&captures[0], cap);
    capture_init(&captures[1], cap);
    /* [0] stdout, [1] stderr, [2] the process once it is watched (a pidfd; -1 before, and
     * without one, when it is polled with waitpid) */
    struct pollfd watched[3] = {
        {.fd = out_pipe[0], .events = POLLIN},
        {.fd = err_pipe[0], .events = POLLIN},
        {.fd = -1, .events = POLLIN},
    };
    int open_pipes = 2, status = 0;
    bool exited = false, watching = false;
    double deadline = started + timeout, watch_from = started + WATCH_PROCESS_AFTER_S;
    double drain_until = 0;
    char *chunk = malloc(READ_CHUNK);
    if (!chunk)
        out_of_memory();
    while (open_pipes || !exited) {
        double now = monotonic(), wait;
        if (!exited) {
            wait = deadline - now;
            if (wait <= 0) {
                r->timed_out = true;
                kill_group(pid);
                wait_for_child(pid, &status);
                exited = true;
                if (watched[2].fd >= 0) { /* reaped: it must not be waited for again */
                    close(watched[2].fd);
                    watched[2].fd = -1;
                }
                drain_until = monotonic() + DRAIN_AFTER_EXIT_S;
                continue;
            }
            bool look = watching ? watched[2].fd < 0 : !open_pipes || now >= watch_from;
            if (look) {
                if (waitpid(pid, &status, WNOHANG) == pid) {
                    exited = true;
                    drain_until = monotonic() + DRAIN_AFTER_EXIT_S;
                    continue;
                }
                if (!watching) {
                    watched[2].fd = open_pidfd(pid);
                    watching = true;
                }
            }
            if (!watching) {
                if (wait > watch_from - now)
                    wait = watch_from - now;
            } else {
                reap_orphans_but(pid);
                double most = watched[2].fd < 0 ? 0.01 : REAP_EVERY_S;
                if (wait > most)
                    wait = most;
            }
        } else {
            wait = drain_until - now;
            if (wait <= 0)
                break; /* something the command left behind still holds its pipes */
        }
        /* at least 1 ms, never less than asked */
        int ready = poll(watched, watched[2].fd >= 0 ? 3 : 2,
                         wait < 1e6 ? (int)(wait * 1000) + 1 : 1000000000);
        if (ready < 0 && errno != EINTR) {
            if (!exited) { /* it cannot be watched any more: end it rather than leave it */
                kill_group(pid);
                wait_for_child(pid, &status);
            }
            break;
        }
        if (ready <= 0)
            continue;
        if (watched[2].fd >= 0 && watched[2].revents) {
            wait_for_child(pid, &status);
            exited = true;
            close(watched[2].fd);
            watched[2].fd = -1;
            drain_until = monotonic() + DRAIN_AFTER_EXIT_S;
        }
        for (int i = 0; i < 2; i++) {
            if (watched[i].fd < 0 || !watched[i].revents)
                continue;
            ssize_t got = read(watched[i].fd, chunk, READ_CHUNK);
            if (got > 0) {
                capture_feed(&captures[i], chunk, (size_t)got);
            } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
                close(watched[i].fd);
                watched[i].fd = -1;
                open_pipes--;
            }
        }
    }
    free(chunk);
    for (int i = 0; i < 3; i++)
        if (watched[i].fd >= 0)
            close(watched[i].fd);
    r->out_dropped = capture_finish(&captures[0], &r->out);
    r->err_dropped = capture_finish(&captures[1], &r->err);
    set_status(r, status);
    r->duration = monotonic() - started;
}

/* A command of the lease's own (not reserved): ``run_command`` within the commands' limit. */
static void run_exec(char *const argv[], double timeout, size_t cap, bool own_session, result *r) {
    run_command(argv, timeout, cap, own_session, false, r);
}

/* ------------------------------------------------------------------------------ the shell */

/* The slot's persistent shell: one tmux session named "main", started on first use. */
typedef struct {
    char dir[PATH_MAX];
    char socket[PATH_MAX];
    const char *workspace;
    const char *tmux; /* NULL: not installed */
    unsigned long counter;
    bool own_sessions; /* false for a bare agent: commands stay in its session */
    bool line_editor;  /* the shell is bash: readline reads the pane's keys at its prompt */
    char tty[64];      /* the pane's terminal ("": not known) */
    pid_t pane;        /* the pane's first process, the shell (0: not known) */
    bool started;      /* a session runs, or ran and ended with nothing said of it yet */
    bool replaced;     /* shell_ensure started a fresh shell in place of one that had ended */
} shell;

/* Run tmux with ``args`` for at most ``limit`` seconds (its client killed then, ``r->timed_out``
 * set); no time left: not run, ``r->timed_out`` set. */
static void tmux_run(shell *sh, double limit, const char *const *args, size_t n, result *r) {
    char *argv[32];
    if (n + 4 > sizeof argv / sizeof *argv) {
        fail(r, "too many tmux arguments");
        return;
    }
    if (!(limit > 0)) {
        r->timed_out = true;
        return;
    }
    argv[0] = (char *)sh->tmux;
    argv[1] = "-S";
    argv[2] = sh->socket;
    for (size_t i = 0; i < n; i++)
        argv[3 + i] = (char *)args[i];
    argv[3 + n] = NULL;
    run_exec(argv, limit, TMUX_CAP, true, r);
}

#define TMUX(sh, r, limit, ...)                                                                \
    do {                                                                                       \
        const char *const tmux_args_[] = {__VA_ARGS__};                                        \
        tmux_run((sh), (limit), tmux_args_, sizeof tmux_args_ / sizeof *tmux_args_, (r));      \
    } while (0)

/* The seconds left until ``deadline``, and at least ``least``. */
static double left_until(double deadline, double least) {
    double left = deadline - monotonic();
    return left > least ? left : least;
}

static bool ran_ok(const result *r) { return !r->failed && r->has_exit && r->exit_code == 0; }

/* Fail ``r`` with ``prefix`` and why ``cause`` failed: its stderr, else its error. */
static void fail_because(result *r, const char *prefix, const result *cause) {
    r->failed = true;
    r->code = NULL;
    r->error.len = 0;
    buf_puts(&r->error, prefix);
    if (!cause->failed && cause->err.len)
        buf_put(&r->error, cause->err.data, cause->err.len);
    else if (cause->failed)
        buf_put(&r->error, cause->error.data, cause->error.len);
    else
        buf_puts(&r->error, "None");
}

/* The first ``size`` - 1 bytes of /proc/PID/``file`` into ``text``, NUL-terminated (empty when
 * it cannot be read); returns how many were read, or -1. */
static ssize_t read_proc(pid_t pid, const char *file, char *text, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, text, size - 1) : -1;
    if (fd >= 0)
        close(fd);
    text[got > 0 ? got : 0] = '\0';
    return got;
}

/* The name of process ``pid`` (its ``comm``, also a zombie's) into ``name``; false when it
 * cannot be read. */
static bool process_name(pid_t pid, char *name, size_t size) {
    if (pid <= 0 || size == 0)
        return false;
    ssize_t got = read_proc(pid, "comm", name, size);
    name[strcspn(name, "\n")] = '\0';
    return got > 0;
}

/* State, parent, session and its terminal's foreground process group (``foreground``, unless
 * NULL) of process ``pid`` from /proc; false when it cannot be read. */
static bool process_stat(pid_t pid, char *state, pid_t *parent, pid_t *session,
                         pid_t *foreground) {
    char text[512];
    if (read_proc(pid, "stat", text, sizeof text) <= 0)
        return false;
    char *name_end = strrchr(text, ')'); /* the name may hold spaces and parentheses */
    int up, group, sid, tty, front;
    if (!name_end ||
        sscanf(name_end + 1, " %c %d %d %d %d %d", state, &up, &group, &sid, &tty, &front) != 6)
        return false;
    *parent = (pid_t)up;
    *session = (pid_t)sid;
    if (foreground)
        *foreground = (pid_t)front;
    return true;
}

/* The process listening on the shell's tmux socket, as the kernel recorded it (it need not
 * answer: a stopped server is found too); 0 when there is none, or it is not this user's, or
 * it is this agent or pid 1. */
static pid_t tmux_server(const shell *sh) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (strlen(sh->socket) >= sizeof address.sun_path)
        return 0;
    strcpy(address.sun_path, sh->socket);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return 0;
    struct ucred peer = {0};
    socklen_t size = sizeof peer;
    bool found = connect(fd, (struct sockaddr *)&address, sizeof address) == 0 &&
                 getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &size) == 0;
    close(fd);
    if (!found || peer.uid != getuid() || peer.pid <= 1 || peer.pid == getpid())
        return 0;
    return peer.pid;
}

enum { MAX_PANES = 256 };

/* End the persistent shell for good: its tmux server (answering or not) and every process in
 * the sessions of its panes (each pane's program leads a session of its own), then the socket,
 * so the next call starts a fresh server and shell. */
static void shell_kill(shell *sh) {
    sh->started = false; /* its caller says what became of the shell */
    pid_t server = tmux_server(sh), panes[MAX_PANES];
    size_t count = 0;
    for (int round = 0; round < 8 && server > 0; round++) {
        DIR *listing = opendir("/proc");
        if (!listing)
            break;
        size_t killed = 0;
        struct dirent *entry;
        while ((entry = readdir(listing)) != NULL) {
            char *end;
            long number = strtol(entry->d_name, &end, 10);
            pid_t pid = (pid_t)number, parent, session;
            char state;
            if (*end || number <= 1 || pid == getpid() || pid == server ||
                !process_stat(pid, &state, &parent, &session, NULL) || state == 'Z')
                continue;
            bool pane = round == 0 && parent == server && session == pid;
            if (pane && count < MAX_PANES)
                panes[count++] = pid;
            for (size_t i = 0; !pane && i < count; i++)
                pane = session == panes[i];
            if (pane && kill(pid, SIGKILL) == 0)
                killed++;
        }
        closedir(listing);
        if (round == 0)
            (void)kill(server, SIGKILL); /* its panes known: none can start after this */
        else if (!killed)
            break;
    }
    (void)unlink(sh->socket);
}

/* As its namespace's pid 1 the agent inherits every orphan of the lease: reap those that
 * ended, so they hold no process slot (pids.max counts the dead until they are reaped). Only
 * between the agent's own waits for a child by pid, so it never takes one of those. */
static void reap_orphans(void) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

/* Wait until ``path`` exists, by ``deadline``, reaping the lease's orphans meanwhile: a
 * command that waits for processes to end (bash retries a fork the limit refused) must not
 * wait for the dead ones until the call is over. With ``watched`` (a pid, not 0) and ``gone``,
 * the wait also ends, ``*gone`` set, once that process has ended. */
static bool wait_for_file_or_end(const char *path, double deadline, pid_t watched, bool *gone) {
    double pause = 0.001;
    while (true) {
        reap_orphans();
        if (exists(path))
            return true;
        char state;
        pid_t parent, session;
        if (watched > 0 && (!process_stat(watched, &state, &parent, &session, NULL) ||
                            state == 'Z' || state == 'X')) {
            *gone = !exists(path);
            return !*gone;
        }
        double now = monotonic();
        if (now >= deadline)
            return false;
        pause_for(pause < deadline - now ? pause : deadline - now);
        pause = pause * 1.5 < 0.02 ? pause * 1.5 : 0.02;
    }
}

static bool wait_for_file(const char *path, double deadline) {
    return wait_for_file_or_end(path, deadline, 0, NULL);
}

/* ``path`` opened for reading if it is a regular file, else -1: the shell's output files are
 * written by commands in the lease, which may swap them for a symlink, a FIFO or a device. */
static int open_regular(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat info;
    if (fd >= 0 && (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The first and last cap/2 bytes of a file into ``text``, as a capture would keep them (nothing
 * when it cannot be read); returns how many bytes fell between. */
static long long read_capped(const char *path, size_t cap, buf *text) {
    text->len = 0;
    int fd = open_regular(path);
    if (fd < 0)
        return 0;
    capture c;
    capture_init(&c, cap);
    struct stat info;
    char *chunk = malloc(READ_CHUNK);
    if (!chunk)
        out_of_memory();
    if (fstat(fd, &info) == 0) {
        off_t size = info.st_size;
        if ((size_t)size > cap) {
            /* head, then the tail from its place; the middle is counted, not read */
            buf_reserve(&c.head, c.head_cap);
            ssize_t got = pread(fd, c.head.data, c.head_cap, 0);
            c.head.len = got > 0 ? (size_t)got : 0;
            buf_reserve(&c.tail, c.tail_cap);
            got = pread(fd, c.tail.data, c.tail_cap, size - (off_t)c.tail_cap);
            c.tail.len = got > 0 ? (size_t)got : 0;
            c.total = (long long)size;
        } else {
            /* no more than the size it had: a file that grows meanwhile is read as it was */
            size_t left = (size_t)size;
            ssize_t got;
            while (left && (got = read(fd, chunk, left < READ_CHUNK ? left : READ_CHUNK)) > 0) {
                capture_feed(&c, chunk, (size_t)got);
                left -= (size_t)got;
            }
        }
    }
    free(chunk);
    close(fd);
    return capture_finish(&c, text);
}

static bool write_file(const char *path, const char *data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return false;
    bool ok = true;
    while (n) {
        ssize_t put = write(fd, data, n);
        if (put < 0 && errno == EINTR)
            continue;
        if (put <= 0) {
            ok = false;
            break;
        }
        data += put;
        n -= (size_t)put;
    }
    return close(fd) == 0 && ok;
}

typedef enum { SHELL_READY, SHELL_FAILED, SHELL_LATE } shell_state;

/* The persistent shell's plumbing for ``bash_stateful``, so that the pane shows what a person
 * at that terminal would see: bash starts with ``DIR/rc`` (the shell's own ~/.bashrc, then
 * ``DIR/run.bash``), sh with ``DIR/run.sh`` as its ENV. A call types ``__run`` (an alias; the
 * call's files are named in ``DIR/call``); ``__run_begin`` erases that line and prints the
 * prompt and the command in its place, the command is sourced at the shell's top level
 * (``declare`` and ``cd`` carry over), and ``__run_end`` prints its output (stdout, then
 * stderr; the last 64 KiB of each) before it writes the status. An EXIT trap writes the status
 * of a command that ends the shell and marks that it did (``.ended``); ``__run_idle`` (typed
 * after Ctrl-C) marks the shell back at its prompt. Bash expands its prompt and keeps the
 * command, not the alias, in its history; sh expands PS1's parameters (not one that holds
 * quotes or backslashes). A shell that replaces this one (``exec bash``, ``exec sh``) or runs
 * in it (``bash``) gets the plumbing too: bash's exported PROMPT_COMMAND reads ``run.bash``
 * where ``__run`` is not an alias, and an interactive sh reads ``run.sh`` as its ENV. */
static const char SHELL_RC_BASH[] =
    "__run_erase() {\n"
    "    local p=${PS1-} width=${COLUMNS:-80} rows=0 line i\n"
    "    p=${p@P}\n"
    "    while [[ $p == *$'\\001'*$'\\002'* ]]; do p=${p%%$'\\001'*}${p#*$'\\002'}; done\n"
    "    p+=$1\n"
    "    (( width > 0 )) || width=80\n"
    "    while [[ $p == *$'\\n'* ]]; do\n"
    "        line=${p%%$'\\n'*}\n"
    "        p=${p#*$'\\n'}\n"
    "        rows=$((rows + (${#line} ? (${#line} + width - 1) / width : 1)))\n"
    "    done\n"
    "    rows=$((rows + ${#p} / width + 1))\n"
    "    printf '\\e[%dA\\r\\e[2K' \"$rows\"\n"
    "    for (( i = 1; i < rows; i++ )); do printf '\\e[B\\e[2K'; done\n"
    "    (( rows == 1 )) || printf '\\e[%dA' $((rows - 1))\n"
    "}\n"
    "__run_begin() {\n"
    "    local command= ps1=${PS1-} ps2=${PS2-}\n"
    "    ps2=${ps2//'$(__run_more)'/}\n"
    "    __run_at=\n"
    "    IFS= read -r __run_at <\"$__run_dir/call\" || return\n"
    "    trap '__run_exit $?' EXIT\n"
    "    IFS= read -r -N 65536 command <\"$__run_at.sh\" || :\n"
    "    command=${command%$'\\n'}\n"
    "    if [[ -o history ]]; then history -s -- \"$command\"; fi\n"
    "    if [ -t 1 ]; then\n"
    "        __run_erase __run\n"
    "        ps1=${ps1@P} ps2=${ps2@P}\n"
    "        printf '%s%s\\n' \"${ps1//[$'\\001\\002']/}\" \"${command//$'\\n'/$'\\n'${ps2//[$'\\001\\002']/}}\"\n"
    "    fi\n"
    "}\n"
    "__run_end() {\n"
    "    local status=$1 file text\n"
    "    if [ -t 1 ]; then\n"
    "        for file in \"$__run_at.out\" \"$__run_at.err\"; do\n"
    "            text=\n"
    "            [ -f \"$file\" ] && { IFS= read -r -N 65537 text <\"$file\" || :; }\n"
    "            if (( ${#text} > 65536 )); then\n"
    "                command -p tail -c 65536 -- \"$file\" 2>/dev/null || :\n"
    "            else\n"
    "                printf '%s' \"$text\"\n"
    "            fi\n"
    "        done\n"
    "    fi\n"
    "    __run_done \"$status\"\n"
    "    [[ $- == *e* ]] || return \"$status\"\n"
    "}\n"
    "__run_idle() {\n"
    "    trap - EXIT\n"
    "    if [ -t 1 ]; then __run_erase __run_idle; fi\n"
    "    IFS= read -r __run_at <\"$__run_dir/call\" && : >\"$__run_at.idle\"\n"
    "}\n"
    "__run_more() { { echo 2 >\"$__run_dir/line\"; } 2>/dev/null; }\n"
    "case ${PS2-} in *__run_more*) ;; *) PS2='$(__run_more)'${PS2-} ;; esac\n"
    "__run_hook=\"alias __run >/dev/null 2>&1 || . ${__run_dir@Q}/run.bash; "
    "{ echo 1 >${__run_dir@Q}/line; } 2>/dev/null\"\n"
    "case ${PROMPT_COMMAND-} in\n"
    "    *\"$__run_hook\"*) ;;\n"
    "    *) PROMPT_COMMAND=$__run_hook${PROMPT_COMMAND:+$'\\n'$PROMPT_COMMAND} ;;\n"
    "esac\n"
    "ENV=$__run_dir/run.sh\n"
    "export PROMPT_COMMAND ENV\n";
/* sh's: the typed line is erased from the line under it, where the shell's output goes on,
 * also when the keys came (and were echoed by the terminal) before the prompt was printed.
 * PS1 and PS2 are expanded as sh expands them, in a subshell (one that cannot be is shown as
 * it is). */
static const char SHELL_RC_SH[] =
    "__run_ps() {\n"
    "    __run_p=$1 __run_q=\n"
    "    while :; do\n"
    "        case $__run_p in\n"
    "            *\\\"*) __run_q=$__run_q${__run_p%%\\\"*}\\\\\\\"; __run_p=${__run_p#*\\\"} ;;\n"
    "            *) break ;;\n"
    "        esac\n"
    "    done\n"
    "    __run_q=$( (eval \"printf '%s.' \\\"$__run_q$__run_p\\\"\") 2>/dev/null) || __run_q=$1.\n"
    "    __run_q=${__run_q%.}\n"
    "}\n"
    "__run_begin() {\n"
    "    __run_at=\n"
    "    IFS= read -r __run_at <\"$__run_dir/call\" || return\n"
    "    trap '__run_exit $?' EXIT\n"
    "    if [ -t 1 ]; then\n"
    "        __run_ps \"${PS2-}\"\n"
    "        __run_ps2=$__run_q\n"
    "        __run_ps \"${PS1-}\"\n"
    "        printf '\\r\\033[2K\\033[1A\\033[2K%s' \"$__run_q\"\n"
    "        __run_q=\n"
    "        while IFS= read -r __run_text || [ -n \"$__run_text\" ]; do\n"
    "            printf '%s%s\\n' \"$__run_q\" \"$__run_text\"\n"
    "            __run_q=$__run_ps2\n"
    "        done <\"$__run_at.sh\"\n"
    "    fi\n"
    "}\n"
    "__run_show() {\n"
    "    [ -s \"$1\" ] || return 0\n"
    "    command -p tail -c 65536 -- \"$1\" 2>/dev/null || command -p cat -- \"$1\" 2>/dev/null || :\n"
    "}\n"
    "__run_end() {\n"
    "    if [ -t 1 ]; then\n"
    "        __run_show \"$__run_at.out\"\n"
    "        __run_show \"$__run_at.err\"\n"
    "    fi\n"
    "    __run_done \"$1\"\n"
    "    case $- in *e*) ;; *) return \"$1\" ;; esac\n"
    "}\n"
    "__run_idle() {\n"
    "    trap - EXIT\n"
    "    if [ -t 1 ]; then printf '\\r\\033[2K\\033[1A\\033[2K'; fi\n"
    "    IFS= read -r __run_at <\"$__run_dir/call\" && : >\"$__run_at.idle\"\n"
    "}\n";
/* The plumbing's programs (mv, tail, cat) are run with ``command -p``: found on the system's
 * default PATH, not a function, so a command that set a PATH without /bin (``export
 * PATH=$HOME/bin``) or defined ``mv`` still gets its exit status and output reported. */
static const char SHELL_RC_COMMON[] =
    "alias __run='__run_begin && . \"$__run_at.sh\" >\"$__run_at.out\" 2>\"$__run_at.err\" </dev/null; __run_end $?'\n"
    "__run_done() {\n"
    "    echo \"$1\" >\"$__run_at.rc.tmp\"\n"
    "    trap - EXIT\n"
    "    command -p mv \"$__run_at.rc.tmp\" \"$__run_at.rc\"\n"
    "}\n"
    "__run_exit() {\n"
    "    : >\"$__run_at.ended\"\n"
    "    __run_done \"$1\"\n"
    "}\n"
    ": >\"$__run_dir/ready\"\n";

/* ``text`` in single quotes, as a shell reads it back. */
static void buf_shell_quoted(buf *b, const char *text) {
    buf_put(b, "'", 1);
    for (const char *at = text; *at; at++) {
        if (*at == '\'')
            buf_puts(b, "'\\''");
        else
            buf_put(b, at, 1);
    }
    buf_put(b, "'", 1);
}

/* ``DIR/NAME``, holding ``__run_dir`` (DIR), then ``plumbing`` and SHELL_RC_COMMON. */
static bool shell_write_plumbing(const shell *sh, const char *name, const char *plumbing) {
    char path[sizeof sh->dir + 16];
    snprintf(path, sizeof path, "%s/%s", sh->dir, name);
    buf text = {0};
    buf_puts(&text, "__run_dir=");
    buf_shell_quoted(&text, sh->dir);
    buf_puts(&text, "\n");
    buf_puts(&text, plumbing);
    buf_puts(&text, SHELL_RC_COMMON);
    bool written = write_file(path, text.data, text.len);
    buf_free(&text);
    return written;
}

/* The rc files (SHELL_RC_BASH's comment): ``run.sh`` always (sh's ENV: the shell's, or that of
 * an sh started in or in place of it), ``run.bash`` and ``rc`` (the path given) for bash. */
static bool shell_write_rc(const shell *sh, const char *rc, bool bash) {
    if (!shell_write_plumbing(sh, "run.sh", SHELL_RC_SH))
        return false;
    if (!bash)
        return true;
    if (!shell_write_plumbing(sh, "run.bash", SHELL_RC_BASH))
        return false;
    /* the history goes to the shell's folder (a reset discards it), never to $HOME: that is the
     * workspace in a sandbox (a .bash_history the env's check would see) and the server's user's
     * home for a bare agent; exported, so a bash started in the pane keeps it too; a ~/.bashrc
     * may set its own */
    buf text = {0};
    buf_puts(&text, "export HISTFILE=");
    buf_shell_quoted(&text, sh->dir);
    buf_puts(&text, "/history\n[ -f ~/.bashrc ] && . ~/.bashrc\n. ");
    buf_shell_quoted(&text, sh->dir);
    buf_puts(&text, "/run.bash\n");
    bool written = write_file(rc, text.data, text.len);
    buf_free(&text);
    return written;
}

/* The mode of the pane's terminal: 1 out of canonical mode (bash's line editor reads keys:
 * readline sets that before it prints the prompt, and canonical mode back before it runs a
 * command); 0 in canonical mode; -1 not known (no line editor or terminal known, or it cannot
 * be read). */
static int shell_tty_raw(const shell *sh) {
    if (!sh->line_editor || !sh->tty[0])
        return -1;
    int fd = open(sh->tty, O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct termios mode;
    int raw = tcgetattr(fd, &mode) == 0 ? !(mode.c_lflag & ICANON) : -1;
    close(fd);
    return raw;
}

/* What the pane's shell does, as far as /proc, its terminal and its plumbing tell. */
typedef enum {
    PANE_AT_PROMPT, /* at its prompt, or it cannot be told */
    PANE_GONE,      /* the shell's process ended */
    PANE_STOPPED,   /* the shell is stopped (``kill -STOP $$``) */
    PANE_PROGRAM,   /* a program that is not a shell is the terminal's foreground (a REPL) */
    PANE_BUSY,      /* bash runs a command of its own or reads input (``read x``) */
    PANE_MORE,      /* bash reads more lines of an unfinished command (a here-document) */
} pane_state;

/* The shells that run a call at their prompt (SHELL_RC_BASH's comment). */
static bool is_shell(const char *name) {
    static const char *const SHELLS[] = {"bash", "sh", "dash", "ash"};
    for (size_t i = 0; i < sizeof SHELLS / sizeof *SHELLS; i++)
        if (strcmp(name, SHELLS[i]) == 0)
            return true;
    return false;
}

/* The first byte of ``path`` (a regular file), or 0. */
static char first_byte(const char *path) {
    int fd = open_regular(path);
    char byte = 0;
    if (fd >= 0 && read(fd, &byte, 1) != 1)
        byte = 0;
    if (fd >= 0)
        close(fd);
    return byte;
}

/* What the pane's shell does: its process's state, the name of the terminal's foreground
 * process (into ``program``, ``size`` bytes, "" when it is not known), and for bash its
 * terminal's mode (canonical: not in its line editor) and whether its line editor reads a
 * continuation line (PS2 expands ``__run_more``, which writes 2 to ``DIR/line``; the prompt
 * writes 1 there). An sh, which has no line editor, is taken to be at its prompt. */
static pane_state shell_pane(const shell *sh, char *program, size_t size) {
    char state, name[32] = "";
    pid_t parent, session, front = 0;
    if (sh->pane <= 0)
        return PANE_AT_PROMPT;
    if (!process_stat(sh->pane, &state, &parent, &session, &front) || state == 'Z' ||
        state == 'X')
        return PANE_GONE;
    if (state == 'T' || state == 't')
        return PANE_STOPPED;
    process_name(front > 0 ? front : sh->pane, name, sizeof name);
    if (size)
        snprintf(program, size, "%s", name);
    if (!is_shell(name))
        return PANE_PROGRAM;
    int raw = strcmp(name, "bash") == 0 ? shell_tty_raw(sh) : -1;
    if (raw == 0)
        return PANE_BUSY;
    char line[sizeof sh->dir + 8];
    snprintf(line, sizeof line, "%s/line", sh->dir);
    return raw == 1 && first_byte(line) == '2' ? PANE_MORE : PANE_AT_PROMPT;
}

/* The fewest open files a shell needs to run a call (SHELL_RC_COMMON's ``__run``): its three
 * standard descriptors, a copy of each kept while the command's are sent to files, and the file
 * it opens. A shell held below it (``ulimit -n 4``) can neither send a command's output to its
 * files nor write its status. */
enum { SHELL_FILES_LEAST = 7 };

/* The process group in the foreground of the pane's terminal (its leader's pid): the shell at
 * its prompt, an inner shell started in it, or a program one of them runs; 0 when not known. */
static pid_t pane_front(const shell *sh) {
    char state;
    pid_t parent, session, front = 0;
    if (sh->pane <= 0 || !process_stat(sh->pane, &state, &parent, &session, &front))
        return 0;
    return front > 0 ? front : 0;
}

/* The soft limit on open files (``ulimit -n``) of the shell that reads the pane's keys (the
 * terminal's foreground process, else the pane's first process), from /proc; -1 when it is not
 * known or unlimited. */
static long shell_files_limit(const shell *sh) {
    char state, text[4096];
    pid_t parent, session, front = 0;
    if (sh->pane <= 0 || !process_stat(sh->pane, &state, &parent, &session, &front) ||
        read_proc(front > 0 ? front : sh->pane, "limits", text, sizeof text) < 0)
        return -1;
    static const char NAME[] = "Max open files";
    const char *line = strstr(text, NAME);
    if (!line)
        return -1;
    char *end;
    long limit = strtol(line + sizeof NAME - 1, &end, 10);
    return end == line + sizeof NAME - 1 || limit < 0 ? -1 : limit;
}

/* Whether the shell holds too few open files to run a call (SHELL_FILES_LEAST), its limit then
 * into ``limit``. */
static bool shell_starved(const shell *sh, long *limit) {
    *limit = shell_files_limit(sh);
    return *limit >= 0 && *limit < SHELL_FILES_LEAST;
}

/* Whether an sh (no line editor: shell_tty_raw cannot tell its prompt) that runs a call
 * (``runner``, its pid) waits for keys at its prompt: it leads the terminal's foreground and is
 * blocked reading its standard input, the terminal, as /proc/PID/syscall shows (a call's command reads /dev/null there, and
 * a program it runs in the foreground holds the terminal's foreground). False when it cannot be
 * told (the file is not readable: no tracehook, or no right to trace the shell). */
static bool shell_reads_terminal(const shell *sh, pid_t runner) {
    char state, text[256];
    pid_t parent, session;
    if (runner <= 0 || pane_front(sh) != runner ||
        !process_stat(runner, &state, &parent, &session, NULL) || state != 'S' ||
        read_proc(runner, "syscall", text, sizeof text) <= 0)
        return false;
    long number;
    unsigned long first;
    return sscanf(text, "%ld 0x%lx", &number, &first) == 2 && number == SYS_read && first == 0;
}

/* Whether keys typed now reach the shell's line editor (shell_tty_raw) at its prompt
 * (shell_pane). Keys typed before that (while the shell is still on its way from the last
 * command to its prompt) are echoed by the terminal ahead of the prompt, and would stay on the
 * screen. True when it cannot be told. */
static bool shell_at_prompt(const shell *sh) {
    return shell_tty_raw(sh) != 0 && shell_pane(sh, NULL, 0) == PANE_AT_PROMPT;
}

/* Wait until the shell is at its prompt (shell_at_prompt), for at most PROMPT_WAIT_S and not
 * past ``deadline``, reaping the lease's orphans meanwhile. Past that the keys are typed
 * anyway: a program running in the foreground reads them, as it did before. */
static void shell_wait_for_prompt(const shell *sh, double deadline) {
    double until = monotonic() + PROMPT_WAIT_S, pause = 0.001;
    if (until > deadline)
        until = deadline;
    while (!shell_at_prompt(sh)) {
        reap_orphans();
        double now = monotonic();
        if (now >= until)
            return;
        pause_for(pause < until - now ? pause : until - now);
        pause = pause * 1.5 < 0.02 ? pause * 1.5 : 0.02;
    }
}

/* Start the session unless it runs, by ``deadline``: SHELL_READY; SHELL_FAILED (with ``r``
 * failed) when it cannot start; SHELL_LATE when tmux did not answer, or the shell did not read
 * its rc file, by ``deadline``. Bash is started with the rc file (``--rcfile``), sh with it as
 * its ENV; nothing of it is typed into the pane. A shell it starts is given PROMPT_WAIT_S to be
 * at its prompt, so that the first keys, the tmux tool's too, are not echoed ahead of it. */
static shell_state shell_ensure(shell *sh, double deadline, result *r) {
    if (!sh->tmux) {
        fail(r, "tmux is not installed");
        r->code = REPLY_NO_TMUX;
        return SHELL_FAILED;
    }
    result probe = {0};
    TMUX(sh, &probe, deadline - monotonic(), "has-session", "-t", "main");
    bool running = ran_ok(&probe), late = probe.timed_out;
    result_free(&probe);
    if (running || late)
        return running ? SHELL_READY : SHELL_LATE;
    /* a session of this lease ended with nothing said of it (``tmux kill-server``, its shell
     * killed from another call, ``exit`` typed through the tmux tool): the call says so */
    sh->replaced = sh->replaced || sh->started; /* kept until a call says it */
    sh->started = false;
    make_dirs(sh->dir);
    char bash[PATH_MAX], rc[sizeof sh->dir + 16], ready[sizeof sh->dir + 8];
    bool has_bash = which("bash", bash, sizeof bash);
    snprintf(rc, sizeof rc, has_bash ? "%s/rc" : "%s/run.sh", sh->dir);
    snprintf(ready, sizeof ready, "%s/ready", sh->dir);
    (void)unlink(ready);
    if (!shell_write_rc(sh, rc, has_bash)) {
        fail(r, "agent failed: cannot write the shell's rc files in %s: %s", sh->dir,
             strerror(errno));
        return SHELL_FAILED;
    }
    sh->line_editor = has_bash;
    sh->tty[0] = '\0';
    result started = {0};
    /* -P: it prints the shell's pid and the pane's terminal. exit-empty off: a shell ended by ``exit`` ends its
     * session but not the server, so the next call starts a new session on a server that is
     * not on its way out. */
    if (has_bash)
        TMUX(sh, &started, deadline - monotonic(), "new-session", "-d", "-P", "-F",
             "#{pane_pid} #{pane_tty}", "-s", "main", "-x", "200", "-y", "50", "-c", sh->workspace, bash,
             "--rcfile", rc, ";", "set-option", "-s", "exit-empty", "off");
    else
        TMUX(sh, &started, deadline - monotonic(), "new-session", "-d", "-P", "-F",
             "#{pane_pid} #{pane_tty}", "-s", "main", "-x", "200", "-y", "50", "-c", sh->workspace,
             "/bin/sh", "-c", "ENV=$0; export ENV; exec /bin/sh -i", rc, ";", "set-option", "-s",
             "exit-empty", "off");
    shell_state state = ran_ok(&started) ? SHELL_READY
                        : started.timed_out ? SHELL_LATE
                                            : SHELL_FAILED;
    sh->started = state == SHELL_READY;
    if (state == SHELL_FAILED)
        fail_because(r, "tmux did not start: ", &started);
    sh->pane = 0;
    size_t length = started.out.len;
    while (length && started.out.data[length - 1] == '\n')
        length--;
    const char *at = started.out.data, *space = length ? memchr(at, ' ', length) : NULL;
    static const char PTS[] = "/dev/pts/";
    if (state == SHELL_READY && space && space > at && space - at < 12) {
        char digits[12];
        memcpy(digits, at, (size_t)(space - at));
        digits[space - at] = '\0';
        char *end;
        long pid = strtol(digits, &end, 10);
        sh->pane = *end == '\0' && pid > 1 && pid <= INT_MAX ? (pid_t)pid : 0;
        length -= (size_t)(space + 1 - at);
        at = space + 1;
    }
    if (state == SHELL_READY && length < sizeof sh->tty && length > sizeof PTS - 1 &&
        memcmp(at, PTS, sizeof PTS - 1) == 0 && !memchr(at, 0, length)) {
        memcpy(sh->tty, at, length);
        sh->tty[length] = '\0';
    }
    result_free(&started);
    if (state == SHELL_READY && !wait_for_file(ready, deadline))
        state = SHELL_LATE;
    if (state == SHELL_READY) /* keys typed now are the line editor's, also the tmux tool's */
        shell_wait_for_prompt(sh, deadline);
    return state;
}

/* The line a call's reply starts with when shell_ensure replaced a shell that had ended. */
static const char SHELL_REPLACED[] =
    "[the shell had ended since the last call (it exited, or it or its tmux server was ended); "
    "this call runs in a fresh shell: its working directory and variables were reset]\n";

/* A call's shell that is not at its prompt (shell_pane) once the call waited for it: a stopped
 * shell gets SIGCONT, then (when that was not enough) Ctrl-C, each followed by at most
 * PROMPT_WAIT_S for the prompt; a shell still not at its prompt then (or whose process ended) is
 * killed (shell_kill) and a fresh one started (shell_ensure), so the call runs at once instead of
 * typing into a program and waiting out its timeout. ``note`` gets a line that says what the
 * shell did and what became of it, for the reply. SHELL_READY with the shell at its prompt,
 * else what shell_ensure says. */
static shell_state shell_recover(shell *sh, double deadline, result *r, buf *note) {
    char program[32];
    pane_state why = shell_pane(sh, program, sizeof program);
    if (why == PANE_AT_PROMPT)
        return SHELL_READY;
    buf_puts(note, "[the shell was not at its prompt (");
    if (why == PANE_PROGRAM)
        buf_printf(note, "%s was running in it", program[0] ? program : "a program");
    else
        buf_puts(note, why == PANE_GONE      ? "its process had ended"
                       : why == PANE_STOPPED ? "it was stopped"
                       : why == PANE_BUSY    ? "it was running a command or reading input"
                                             : "it was reading the rest of an unfinished command, "
                                               "such as a here-document or an open quote");
    buf_puts(note, "); ");
    bool continued = why == PANE_STOPPED && kill(sh->pane, SIGCONT) == 0;
    if (continued) {
        shell_wait_for_prompt(sh, deadline);
        why = shell_pane(sh, NULL, 0);
    }
    bool interrupted = false;
    if (why != PANE_AT_PROMPT && why != PANE_GONE) {
        result sent = {0};
        TMUX(sh, &sent, left_until(deadline, 0), "send-keys", "-t", "main", "C-c");
        interrupted = ran_ok(&sent);
        result_free(&sent);
        if (interrupted) {
            shell_wait_for_prompt(sh, deadline);
            why = shell_pane(sh, NULL, 0);
        }
    }
    if (why == PANE_AT_PROMPT) {
        buf_puts(note, interrupted ? "it got Ctrl-C, which dropped what ran or was being typed there"
                                   : "it was continued (SIGCONT)");
        buf_puts(note, ", and the command ran at its prompt: its directory and variables kept]\n");
        return SHELL_READY;
    }
    shell_kill(sh);
    buf_puts(note, "it was replaced by a fresh shell: its working directory and variables were "
                   "reset]\n");
    return shell_ensure(sh, deadline, r);
}

/* Wait until the call's status file ``rc`` exists, by ``deadline`` (wait_for_file_or_end:
 * ``*gone`` set when the shell's process ends first), or until the command is seen to have
 * ended without writing it: ``runner``, the shell the call's keys were typed to (the pane's
 * foreground then, pane_front; 0: not known), holds the terminal's foreground again, back in
 * its line editor at its prompt (an sh, which has none: blocked reading its terminal,
 * shell_reads_terminal), with too few open files to write the file (shell_starved; ``*files``
 * set to its limit, else -1); or the shell's process was replaced by a program (``exec``; its
 * name into ``program``, ``size`` bytes, else left as it was). Only the command can have
 * lowered the limit (a shell starved before the call is replaced before it types), and bash's
 * line editor reads keys again only once the command has ended: a command still running, or a
 * program or shell it started in the foreground (another process group), is never taken for
 * that. */
static bool shell_wait_for_status(const shell *sh, pid_t runner, const char *rc, double deadline,
                                  bool *gone, long *files, char *program, size_t size) {
    double pause = 0.001;
    *files = -1;
    while (true) {
        if (wait_for_file_or_end(rc, 0, sh->pane, gone)) /* one look, and the orphans reaped */
            return true;
        /* the shell's own process runs (or ran, a zombie) a program that is not a shell: the
         * command replaced the shell with it (``exec sleep 100``), which writes no status */
        char name[32];
        if (process_name(sh->pane, name, sizeof name) && !is_shell(name)) {
            snprintf(program, size, "%s", name);
            return false;
        }
        if (*gone)
            return false;
        long limit;
        /* the shell that runs the call holds the terminal's foreground again: a program
         * or an inner shell the command runs (``sh -c 'stty raw; ulimit -n 5; ...'``) is not
         * that shell, whatever its name, mode and limit */
        bool prompt = sh->line_editor
                          ? runner > 0 && shell_tty_raw(sh) == 1 && pane_front(sh) == runner &&
                                shell_starved(sh, &limit) &&
                                shell_pane(sh, NULL, 0) == PANE_AT_PROMPT
                          : shell_reads_terminal(sh, runner) && shell_starved(sh, &limit);
        if (prompt && !exists(rc)) {
            *files = limit;
            return false;
        }
        double now = monotonic();
        if (now >= deadline)
            return false;
        pause_for(pause < deadline - now ? pause : deadline - now);
        pause = pause * 1.5 < 0.02 ? pause * 1.5 : 0.02;
    }
}

/* After a call's time ran out: Ctrl-C to the pane, then (once the shell is at its prompt, or
 * PROMPT_WAIT_S on) ``__run_idle``, which creates ``idle``. True when it appears within
 * SHELL_SETTLE_S of the Ctrl-C (the command stopped and the shell is back at its prompt, its
 * state kept); else the shell is killed (shell_kill) and false. */
static bool shell_interrupt(shell *sh, const char *idle) {
    result sent = {0};
    TMUX(sh, &sent, TMUX_LATE_S, "send-keys", "-t", "main", "C-c");
    double settle_by = monotonic() + SHELL_SETTLE_S;
    bool settled = ran_ok(&sent);
    result_free(&sent);
    if (settled) {
        shell_wait_for_prompt(sh, settle_by);
        sent = (result){0};
        TMUX(sh, &sent, TMUX_LATE_S, "send-keys", "-t", "main", "-l", "__run_idle", ";",
             "send-keys", "-t", "main", "Enter");
        settled = ran_ok(&sent) && wait_for_file(idle, settle_by);
        result_free(&sent);
    }
    if (!settled)
        shell_kill(sh);
    return settled;
}

/* Run ``command`` in the persistent shell: written to a file that ``__run`` (SHELL_RC_COMMON)
 * sources with its output sent to files and its exit status written by a rename, so the code
 * is exact and the shell keeps its state, and the pane shows the command and its output. Past
 * ``timeout`` the command gets Ctrl-C; a shell not back at its prompt soon after is killed with
 * everything it runs (the reply's signal: 2 for Ctrl-C, 9 for killed). */
static void shell_run(shell *sh, const char *command, size_t length, double timeout, size_t cap,
                      result *r) {
    double started = monotonic(), deadline = started + timeout;
    shell_state state = shell_ensure(sh, deadline, r);
    if (state == SHELL_FAILED)
        return;
    sh->counter++;
    char base[PATH_MAX + 32];
    snprintf(base, sizeof base, "%s/%lu", sh->dir, sh->counter);
    char script[sizeof base + 8], rc[sizeof base + 8], out[sizeof base + 8], err[sizeof base + 8];
    char rc_tmp[sizeof base + 16], ended[sizeof base + 16], idle[sizeof base + 16];
    char call[sizeof sh->dir + 8];
    snprintf(call, sizeof call, "%s/call", sh->dir);
    snprintf(ended, sizeof ended, "%s.ended", base);
    snprintf(idle, sizeof idle, "%s.idle", base);
    snprintf(script, sizeof script, "%s.sh", base);
    snprintf(rc, sizeof rc, "%s.rc", base);
    snprintf(rc_tmp, sizeof rc_tmp, "%s.rc.tmp", base);
    snprintf(out, sizeof out, "%s.out", base);
    snprintf(err, sizeof err, "%s.err", base);
    bool late = state == SHELL_LATE;
    buf note = {0}; /* shell_ensure's and shell_recover's lines */
    if (sh->replaced)
        buf_puts(&note, SHELL_REPLACED);
    sh->replaced = false;
    bool gone = false; /* the shell's process ended before the command's status was written */
    long starved = -1; /* the shell's open-files limit, when too low to write the status */
    char execd[32] = ""; /* the program the command replaced the shell with (``exec``) */
    /* the call's files, for ``__run`` and, after Ctrl-C, ``__run_idle`` */
    size_t named = strlen(base);
    base[named] = '\n';
    bool pointed = write_file(call, base, named + 1);
    base[named] = '\0';
    if (!pointed) {
        fail(r, "agent failed: cannot write %s: %s", call, strerror(errno));
        return;
    }
    if (!late) {
        buf text = {0};
        buf_put(&text, command, length);
        buf_put(&text, "\n", 1);
        bool written = write_file(script, text.data, text.len);
        buf_free(&text);
        if (!written) {
            fail(r, "agent failed: cannot write %s: %s", script, strerror(errno));
            return;
        }
        /* The EXIT trap records the status also when the command ends the shell with ``exit``,
         * and marks that it did (``.ended``), so the next call waits for that session to be
         * gone. Keys the tmux tool left on the line (sent without Enter) are dropped first
         * (end of line, then kill the line: readline's keys, and the terminal's VKILL for sh),
         * so that the line is only ``__run``. */
        shell_wait_for_prompt(sh, deadline);
        state = shell_recover(sh, deadline, r, &note);
        if (state == SHELL_FAILED) {
            buf_free(&note);
            (void)unlink(script);
            return;
        }
        long files;
        if (state == SHELL_READY && shell_starved(sh, &files)) {
            /* ``ulimit -n 4`` in an earlier call, or typed through the tmux tool: this shell
             * cannot run a command with its output sent to files */
            shell_kill(sh);
            buf_printf(&note, "[the shell's open-files limit (ulimit -n) was %ld, too few for it to "
                              "run a command with its output sent to files; it was replaced by a "
                              "fresh shell: its working directory and variables were reset]\n",
                       files);
            state = shell_ensure(sh, deadline, r);
            if (state == SHELL_FAILED) {
                buf_free(&note);
                (void)unlink(script);
                return;
            }
        }
        late = state == SHELL_LATE;
        result sent = {0};
        pid_t runner = late ? 0 : pane_front(sh); /* at its prompt: the shell the keys reach */
        if (!late)
            TMUX(sh, &sent, deadline - monotonic(), "send-keys", "-t", "main", "C-e", "C-u", ";",
                 "send-keys", "-t", "main", "-l", "__run", ";", "send-keys", "-t", "main",
                 "Enter");
        late = late || sent.timed_out;
        if (!late && !ran_ok(&sent)) {
            fail_because(r, "tmux send-keys failed: ", &sent);
            result_free(&sent);
            buf_free(&note);
            (void)unlink(script);
            return;
        }
        result_free(&sent);
        bool found = !late && shell_wait_for_status(sh, runner, rc, deadline, &gone, &starved,
                                                    execd, sizeof execd);
        late = late || !(found || starved >= 0 || execd[0]);
    }
    bool interrupted = late && shell_interrupt(sh, idle);
    bool has_code = false;
    long code = 0;
    int fd = late ? -1 : open_regular(rc);
    if (fd >= 0) {
        char digits[64];
        ssize_t got = read(fd, digits, sizeof digits - 1);
        close(fd);
        if (got > 0) {
            digits[got] = '\0';
            char *end;
            errno = 0;
            code = strtol(digits, &end, 10);
            while (*end == ' ' || *end == '\n' || *end == '\t' || *end == '\r')
                end++;
            has_code = errno == 0 && end != digits && *end == '\0' && code >= INT_MIN &&
                       code <= INT_MAX;
        }
    }
    r->out_dropped = read_capped(out, cap, &r->out);
    r->err_dropped = read_capped(err, cap, &r->err);
    if (note.len) { /* what became of a shell not at its prompt, ahead of the command's stderr */
        buf_put(&note, r->err.data, r->err.len);
        buf_free(&r->err);
        r->err = note;
        note = (buf){0};
    }
    if (!late && exists(ended)) {
        /* the command ended the shell: wait (bounded) until its session is gone, so the next
         * call starts a fresh shell instead of typing into this one as it exits, or until the
         * pane's line editor reads keys again */
        double gone_by = monotonic() + 2.0;
        if (gone_by > deadline + TMUX_LATE_S)
            gone_by = deadline + TMUX_LATE_S > monotonic() ? deadline + TMUX_LATE_S
                                                           : monotonic() + TMUX_LATE_S;
        while (monotonic() < gone_by) {
            result probe = {0};
            TMUX(sh, &probe, gone_by - monotonic(), "has-session", "-t", "main");
            bool running = ran_ok(&probe);
            result_free(&probe);
            if (!running) { /* the shell of the session ended: this reply says so */
                buf_puts(&r->err, "[the command ended the shell: the next call starts a fresh "
                                  "shell, whose working directory and variables are reset]\n");
                sh->started = false;
                break;
            }
            /* the session goes on with a shell at its prompt: the one that ended was started
             * in it (``bash``, then ``exit``) */
            if (shell_tty_raw(sh) == 1)
                break;
            struct timespec pause = {0, 10 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
    }
    const char *leftovers[] = {script, out, err, rc, rc_tmp, ended, idle};
    for (size_t i = 0; i < sizeof leftovers / sizeof *leftovers; i++)
        (void)unlink(leftovers[i]);
    if (execd[0] && gone) { /* ``exec true``: the program ended, and with it the pane */
        shell_kill(sh);
        buf_printf(&r->err, "[the command replaced the shell with a program (exec %s), which has "
                            "ended: no exit status can be reported; the next call starts a fresh "
                            "shell, whose working directory and variables are reset]\n",
                   execd);
        r->duration = monotonic() - started;
        return;
    }
    if (execd[0]) { /* ``exec sleep 100``, ``exec python3``: it runs where the shell was */
        buf_printf(&r->err, "[the command replaced the shell with a program (exec %s): no "
                            "exit status can be reported; while the program runs in the pane, "
                            "the tmux tool reaches it; the next call starts a fresh shell (the "
                            "program gets Ctrl-C first if it still runs), whose working "
                            "directory and variables are reset]\n",
                   execd);
        r->duration = monotonic() - started;
        return;
    }
    if (gone) { /* ``kill -9 $$``: no EXIT trap ran; the session may linger a moment */
        shell_kill(sh);
        fail(r, "the shell ended while it ran the command (it was killed, or replaced by a "
                "program it exec'd that ended at once), before it wrote the command's exit "
                "status; the next call starts a fresh shell: its working directory and "
                "variables are reset");
        r->duration = monotonic() - started;
        return;
    }
    if (!late && !has_code && (starved >= 0 || shell_starved(sh, &starved))) {
        /* ``ulimit -n 4``: the command ran, and its output is kept, but the shell can no longer
         * write a file, its status's or the next command's output; it is no use for another */
        shell_kill(sh);
        buf_printf(&r->err, "[the shell could not report the command's exit status: its "
                            "open-files limit (ulimit -n) is %ld, too few for it to write its "
                            "status file; the shell was ended, and the next call starts a fresh "
                            "shell, whose working directory and variables are reset]\n",
                   starved);
        r->duration = monotonic() - started;
        return;
    }
    if (!late && !has_code) {
        /* the command ended, but its status file is empty or unreadable: most often its /tmp
         * (where the file is written) was full; never a success without a code */
        fail(r, "the command's exit status was lost: the shell could not write it to %s (is "
                "/tmp full?)", rc);
        return;
    }
    r->has_exit = !late;
    r->exit_code = (int)code;
    r->has_signal = late;
    r->signal = interrupted ? SIGINT : SIGKILL;
    r->timed_out = late;
    r->duration = monotonic() - started;
}

/* Send keys to the session, wait, and capture the pane, keeping to ``timeout``: keys not sent
 * by then are dropped (``timed_out``, with the pane as it is); a tmux server that does not
 * answer then is killed with the shell (the reply's signal 9), so the next call starts afresh. */
static void shell_keys(shell *sh, char *const *keys, size_t n, bool literal, bool enter,
                       double timeout, double wait, long lines, result *r) {
    double started = monotonic(), deadline = started + timeout;
    shell_state state = shell_ensure(sh, deadline, r);
    if (state == SHELL_FAILED)
        return;
    bool late = state == SHELL_LATE, replaced = sh->replaced;
    sh->replaced = false;
    for (size_t i = 0; i < n && !late; i++) {
        result sent = {0};
        if (literal)
            TMUX(sh, &sent, deadline - monotonic(), "send-keys", "-t", "main", "-l", keys[i]);
        else
            TMUX(sh, &sent, deadline - monotonic(), "send-keys", "-t", "main", keys[i]);
        late = sent.timed_out;
        bool ok = late || ran_ok(&sent);
        if (!ok)
            fail_because(r, "tmux send-keys failed: ", &sent);
        result_free(&sent);
        if (!ok)
            return;
    }
    if (enter && !late) {
        result sent = {0};
        TMUX(sh, &sent, deadline - monotonic(), "send-keys", "-t", "main", "Enter");
        late = sent.timed_out;
        result_free(&sent);
    }
    if (!late)
        pause_for(wait < deadline - monotonic() ? wait : deadline - monotonic());
    char start[32];
    snprintf(start, sizeof start, "-%ld", lines);
    TMUX(sh, r, late ? TMUX_LATE_S : left_until(deadline, TMUX_LATE_S), "capture-pane", "-p", "-J",
         "-t", "main", "-S", start);
    if (r->failed)
        return;
    if (!late && !r->timed_out && !ran_ok(r)) {
        /* no pane to capture: the keys ended the session's shell (``exit``, Ctrl-D) */
        result probe = {0};
        TMUX(sh, &probe, left_until(deadline, TMUX_LATE_S), "has-session", "-t", "main");
        bool ended = !probe.failed && probe.has_exit && probe.exit_code != 0;
        result_free(&probe);
        if (ended) {
            result_free(r);
            *r = (result){.has_exit = true, .exit_code = 0};
            buf_puts(&r->err, "[the session's shell has exited (the keys, or another process, "
                              "ended it): no pane is left to show; the next bash_stateful or tmux "
                              "call starts a fresh shell, whose working directory and variables "
                              "are reset]\n"); /* and that call says so again (SHELL_REPLACED) */
        }
    }
    if (r->timed_out) { /* the server did not answer even past the call's time */
        result_free(r);
        *r = (result){.has_signal = true, .signal = SIGKILL};
        shell_kill(sh);
        late = true;
    }
    if (late) {
        r->has_exit = false;
        r->timed_out = true;
    }
    if (replaced)
        buf_puts(&r->err, SHELL_REPLACED);
    r->duration = monotonic() - started;
}

/* ------------------------------------------------------------------------------ requests */

typedef struct {
    size_t count;
    char **text;    /* each NUL-terminated */
    size_t *length; /* without the NUL */
} fields;

static void fields_free(fields *f) {
    if (f->count)
        free(f->text[0]);
    free(f->text);
    free(f->length);
    *f = (fields){0};
}

/* The 4-byte big-endian number at ``at``: every length on the channel. */
static uint32_t be32(const unsigned char *at) {
    return (uint32_t)at[0] << 24 | (uint32_t)at[1] << 16 | (uint32_t)at[2] << 8 | at[3];
}

/* Split a request body into its fields; false when it is malformed. */
static bool parse_fields(const unsigned char *body, size_t n, fields *f) {
    size_t count = 0, at = 0;
    while (at < n) {
        if (n - at < HEADER_SIZE)
            return false;
        uint32_t size = be32(body + at);
        if (size > n - at - HEADER_SIZE)
            return false;
        at += HEADER_SIZE + size;
        count++;
    }
    if (!count)
        return false;
    f->count = count;
    f->text = calloc(count, sizeof *f->text);
    f->length = calloc(count, sizeof *f->length);
    char *store = malloc(n + count);
    if (!f->text || !f->length || !store)
        out_of_memory();
    at = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t size = be32(body + at);
        at += HEADER_SIZE;
        memcpy(store, body + at, size);
        store[size] = '\0';
        f->text[i] = store;
        f->length[i] = size;
        store += size + 1;
        at += size;
    }
    return true;
}

static bool number(const fields *f, size_t index, const char *name, double *value, result *r) {
    char *end;
    errno = 0;
    *value = strtod(f->text[index], &end);
    bool finite = *value - *value == 0; /* false for NaN and the infinities */
    if (errno || end == f->text[index] || *end || !finite ||
        strlen(f->text[index]) != f->length[index]) {
        fail(r, "agent failed: TypeError: %s must be a finite number, got %s", name,
             f->text[index]);
        return false;
    }
    return true;
}

/* An argv field: NUL bytes cannot reach a program. */
static bool plain(const fields *f, size_t from, const char *name, result *r) {
    for (size_t i = from; i < f->count; i++) {
        if (memchr(f->text[i], '\0', f->length[i])) {
            fail(r, "agent failed: ValueError: %s holds a NUL byte", name);
            return false;
        }
    }
    return true;
}

/* Bytes kept per stream: at least 1, at most 64 MiB (a reply must fit its 4-byte length even
 * when every byte is escaped six times over). */
static size_t as_cap(double cap) { return cap < 1 ? 1 : cap > 0x1p26 ? (size_t)0x1p26 : (size_t)cap; }

/* Field ``index`` is exactly ``text`` (a NUL byte inside a field does not end it). */
static bool is(const fields *f, size_t index, const char *text) {
    return f->length[index] == strlen(text) && memcmp(f->text[index], text, f->length[index]) == 0;
}

/* Whether the request has ``count`` fields (at least ``count`` unless ``exact``); else ``r`` says
 * what the request needs. */
static bool has_fields(const fields *f, size_t count, bool exact, const char *needs, result *r) {
    if (exact ? f->count == count : f->count >= count)
        return true;
    fail(r, needs);
    return false;
}

static void answer(shell *sh, const fields *f, result *r) {
    double timeout, cap, wait, lines;
    bool verify = is(f, 0, "verify");
    if (verify || is(f, 0, "exec")) {
        if (!has_fields(f, 4, false,
                        "agent failed: ValueError: an exec request needs a timeout, a cap and a program", r) ||
            !number(f, 1, "timeout", &timeout, r) || !number(f, 2, "cap", &cap, r) ||
            !plain(f, 3, "argv", r))
            return;
        size_t argc = f->count - 3;
        char **argv = calloc(argc + 1, sizeof *argv);
        if (!argv)
            out_of_memory();
        for (size_t i = 0; i < argc; i++)
            argv[i] = f->text[3 + i];
        run_command(argv, timeout, as_cap(cap), sh->own_sessions, verify, r);
        free(argv);
    } else if (is(f, 0, "stateful")) {
        if (!has_fields(f, 4, true,
                        "agent failed: ValueError: a stateful request needs a timeout, a cap and a command", r) ||
            !number(f, 1, "timeout", &timeout, r) || !number(f, 2, "cap", &cap, r))
            return;
        shell_run(sh, f->text[3], f->length[3], timeout, as_cap(cap), r);
    } else if (is(f, 0, "tmux")) {
        if (!has_fields(f, 6, false,
                        "agent failed: ValueError: a tmux request needs a timeout, literal, enter, wait and lines", r) ||
            !number(f, 1, "timeout", &timeout, r) || !number(f, 4, "wait", &wait, r) ||
            !number(f, 5, "lines", &lines, r) || !plain(f, 6, "keys", r))
            return;
        long rows = lines < 1 ? 1 : lines > 10000 ? 10000 : (long)lines;
        shell_keys(sh, f->text + 6, f->count - 6, is(f, 2, "1"), is(f, 3, "1"), timeout, wait, rows,
                   r);
    } else {
        buf named = {0};
        json_string(&named, f->text[0], f->length[0]);
        fail(r, "unknown op %.*s", (int)(named.len < 200 ? named.len : 200), named.data);
        buf_free(&named);
    }
}

/* ------------------------------------------------------------------------------ channel */

static bool read_exact(int fd, unsigned char *into, size_t n) {
    while (n) {
        ssize_t got = read(fd, into, n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return false;
        into += got;
        n -= (size_t)got;
    }
    return true;
}

/* The channel's input as read: a request's header and body come in one read (the server
 * writes them together), and whatever that read brought beyond the request (the next request,
 * if a server sent one early) waits here for its turn. */
enum { READ_AHEAD = 1 << 16 };
typedef struct {
    unsigned char *data; /* READ_AHEAD bytes */
    size_t start, len;   /* the unread bytes: data[start .. start + len) */
} inbox;

/* Read until the inbox holds at least ``n`` (at most READ_AHEAD) bytes; false at the end of
 * input or on an error. */
static bool inbox_fill(int fd, inbox *in, size_t n) {
    if (in->start + n > READ_AHEAD) {
        memmove(in->data, in->data + in->start, in->len);
        in->start = 0;
    }
    while (in->len < n) {
        unsigned char *end = in->data + in->start + in->len;
        ssize_t got = read(fd, end, READ_AHEAD - in->start - in->len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return false;
        in->len += (size_t)got;
    }
    return true;
}

static void inbox_take(inbox *in, size_t n) {
    in->start += n;
    in->len -= n;
    if (!in->len)
        in->start = 0;
}

static bool send_message(int fd, const buf *body) {
    if (body->len > UINT32_MAX) { /* cannot happen with capped streams; never desynchronise */
        fprintf(stderr, "slot-helper: a reply of %zu bytes does not fit its frame\n", body->len);
        return false;
    }
    unsigned char header[HEADER_SIZE] = {
        (unsigned char)(body->len >> 24), (unsigned char)(body->len >> 16),
        (unsigned char)(body->len >> 8), (unsigned char)body->len};
    struct iovec parts[2] = {{header, HEADER_SIZE}, {body->data, body->len}};
    size_t left = HEADER_SIZE + body->len;
    int part = 0;
    while (left) {
        ssize_t put = writev(fd, parts + part, 2 - part);
        if (put < 0 && errno == EINTR)
            continue;
        if (put <= 0)
            return false;
        left -= (size_t)put;
        while (part < 2 && (size_t)put >= parts[part].iov_len) {
            put -= (ssize_t)parts[part].iov_len;
            part++;
        }
        if (part < 2) {
            parts[part].iov_base = (char *)parts[part].iov_base + put;
            parts[part].iov_len -= (size_t)put;
        }
    }
    return true;
}

/* Serve one lease's requests on ``fd`` until end of input; returns the exit status. */
static int serve(int fd, const char *state_dir, const char *workspace, const char *tmux,
                 bool own_sessions) {
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC); /* no command inherits the channel */
    /* Broken pipes and oversized files are errors to report, not reasons to die; every
     * command gets the default dispositions back. */
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    (void)prctl(PR_SET_NAME, own_sessions ? "slot-lease" : "slot-agent", 0, 0, 0);
    if (chdir(workspace) != 0) {
        fprintf(stderr, "slot-helper: cannot enter %s: %s\n", workspace, strerror(errno));
        return 2;
    }
    shell sh = {.workspace = workspace, .tmux = tmux && tmux[0] ? tmux : NULL,
                .own_sessions = own_sessions};
    if (snprintf(sh.dir, sizeof sh.dir, "%s/shell", state_dir) >= (int)sizeof sh.dir ||
        snprintf(sh.socket, sizeof sh.socket, "%s/tmux.sock", state_dir) >= (int)sizeof sh.socket) {
        fprintf(stderr, "slot-helper: the state directory's name is too long\n");
        return 2;
    }
    make_dirs(sh.dir);
    hold_command_nproc();

    buf reply = {0};
    buf_printf(&reply, "{\"ready\":true,\"pid\":%d,\"tmux\":%s}", (int)getpid(),
               sh.tmux ? "true" : "false");
    if (!send_message(fd, &reply))
        return 0;
    inbox in = {.data = malloc(READ_AHEAD)};
    if (!in.data)
        out_of_memory();
    while (true) {
        if (!inbox_fill(fd, &in, HEADER_SIZE))
            return 0;
        uint32_t size = be32(in.data + in.start);
        if (size > MAX_REQUEST) {
            fprintf(stderr, "slot-helper: a request of %u bytes is over the limit\n", size);
            return 1;
        }
        inbox_take(&in, HEADER_SIZE);
        /* the body: in the inbox when it fits there, else read on into a buffer of its own */
        unsigned char *body = NULL;
        if (size <= READ_AHEAD) {
            if (!inbox_fill(fd, &in, size))
                return 0;
        } else {
            body = malloc(size);
            if (!body)
                out_of_memory();
            memcpy(body, in.data + in.start, in.len);
            bool read = read_exact(fd, body + in.len, size - in.len);
            inbox_take(&in, in.len);
            if (!read) {
                free(body);
                return 0;
            }
        }
        fields f = {0};
        result r = {0};
        if (parse_fields(body ? body : in.data + in.start, size, &f))
            answer(&sh, &f, &r);
        else
            fail(&r, "agent failed: ValueError: a malformed request of %u bytes", size);
        if (body)
            free(body);
        else
            inbox_take(&in, size);
        fields_free(&f);
        reply.len = 0;
        write_result(&reply, &r);
        result_free(&r);
        reap_orphans();
        if (!send_message(fd, &reply))
            return 0;
    }
}

/* ============================================================================ the keeper */

enum { LEASE_FD = 3, MAX_CARRIED = 64, MAX_LIMITS = 8, MAX_KERNEL_PATHS = 32 };

/* A kernel interface a lease hides or makes read-only (isolation's MASKED_PATHS and
 * READ_ONLY_PATHS). */
typedef struct {
    const char *path;
    enum { ABSENT, MASK_FILE, MASK_DIR, READ_ONLY } how;
} kernel_path;

typedef struct {
    const char *path;
    bool read_only;     /* remounted read-only after the bind */
    unsigned long kept; /* its flags to repeat in that remount */
} carried;

/* What every lease of a keeper gets, worked out once by the keeper. */
typedef struct {
    const char *workspace, *state_dir, *tmp;
    char tmux[PATH_MAX]; /* empty: not installed */
    carried carry[MAX_CARRIED];
    size_t carry_count;
    struct {
        int resource;
        rlim_t value;
    } limits[MAX_LIMITS];
    size_t limit_count;
    bool dev_shm;
    char tmpfs[256];           /* the lease tmpfs's mount options (mode, size, inodes) */
    unsigned long dev_kept;
    kernel_path kernel[MAX_KERNEL_PATHS];
    size_t kernel_count;
    bool own_network;          /* each lease gets a network namespace of its own (loopback) */
    pid_t readied;             /* the next lease's first process, readied while idle (0: none) */
    int readied_socket;        /* the keeper's end of its request socket (-1: none) */
    struct sock_filter *filter; /* every lease's seccomp filter (NULL: none) */
    size_t filter_length;       /* in instructions */
} plan;

static const char DEV_SHM[] = "/dev/shm";

static void die(const char *what) {
    fprintf(stderr, "slot-helper: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* The flags of ``path``'s mount that a read-only remount of it must repeat (nosuid, nodev,
 * noexec and the atime flags: a user namespace may not clear them), as ``mount`` flags. */
static unsigned long kept_flags(const char *path) {
    static const struct {
        unsigned long statvfs_flag, mount_flag;
    } kept[] = {{ST_NOSUID, MS_NOSUID},       {ST_NODEV, MS_NODEV},
                {ST_NOEXEC, MS_NOEXEC},       {ST_NOATIME, MS_NOATIME},
                {ST_NODIRATIME, MS_NODIRATIME}, {ST_RELATIME, MS_RELATIME}};
    struct statvfs info;
    if (statvfs(path, &info) != 0)
        die(path);
    unsigned long flags = 0;
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++)
        if (info.f_flag & kept[i].statvfs_flag)
            flags |= kept[i].mount_flag;
    return flags;
}

static bool parse_limit(const char *name, const char *value, plan *p) {
    static const struct {
        const char *name;
        int resource;
    } known[] = {{"nproc", RLIMIT_NPROC}, {"as", RLIMIT_AS},     {"cpu", RLIMIT_CPU},
                 {"fsize", RLIMIT_FSIZE}, {"nice", RLIMIT_NICE}, {"core", RLIMIT_CORE}};
    char *end;
    errno = 0;
    unsigned long long number = strtoull(value, &end, 10);
    if (errno || *end || end == value || p->limit_count == MAX_LIMITS)
        return false;
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
        if (strcmp(name, known[i].name) == 0) {
            p->limits[p->limit_count].resource = known[i].resource;
            p->limits[p->limit_count].value = (rlim_t)number;
            p->limit_count++;
            return true;
        }
    }
    return false;
}

/* The seccomp filter from its hex text (a struct sock_filter array, 8 bytes each). */
static bool parse_filter(const char *hex, plan *p) {
    size_t n = strlen(hex);
    if (!n || n % 16 || n / 16 > BPF_MAXINSNS)
        return false;
    unsigned char *bytes = malloc(n / 2);
    if (!bytes)
        out_of_memory();
    for (size_t i = 0; i < n / 2; i++) {
        unsigned int byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1) {
            free(bytes);
            return false;
        }
        bytes[i] = (unsigned char)byte;
    }
    p->filter = (struct sock_filter *)(void *)bytes;
    p->filter_length = n / 16;
    return true;
}

/* ``keep --workspace W --state-dir S --tmp T [--limit NAME VALUE]... [--carry-rw PATH]...
 * [--carry-ro PATH]...`` and the rest of usage(); false on anything else. */
static bool parse_plan(int argc, char **argv, plan *p) {
    snprintf(p->tmpfs, sizeof p->tmpfs, "mode=0700");
    for (int i = 2; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "--own-network") == 0) {
            p->own_network = true;
            continue;
        }
        if (i + 1 >= argc)
            return false;
        const char *value = argv[++i];
        if (strcmp(flag, "--workspace") == 0)
            p->workspace = value;
        else if (strcmp(flag, "--state-dir") == 0)
            p->state_dir = value;
        else if (strcmp(flag, "--tmp") == 0)
            p->tmp = value;
        else if (strcmp(flag, "--tmpfs-options") == 0) {
            int n = snprintf(p->tmpfs, sizeof p->tmpfs, "mode=0700,%s", value);
            if (n < 0 || (size_t)n >= sizeof p->tmpfs)
                return false;
        }
        else if (strcmp(flag, "--command-nproc") == 0) {
            char *end;
            errno = 0;
            unsigned long long number = strtoull(value, &end, 10);
            if (errno || *end || end == value || !number || number >= RLIM_INFINITY)
                return false;
            command_nproc = (rlim_t)number;
        } else if (strcmp(flag, "--limit") == 0) {
            if (i + 1 >= argc || !parse_limit(value, argv[++i], p))
                return false;
        } else if (strcmp(flag, "--seccomp") == 0) {
            if (!parse_filter(value, p))
                return false;
        } else if (strcmp(flag, "--mask") == 0 || strcmp(flag, "--read-only") == 0) {
            if (p->kernel_count == MAX_KERNEL_PATHS)
                return false;
            p->kernel[p->kernel_count].path = value;
            p->kernel[p->kernel_count].how = strcmp(flag, "--mask") == 0 ? MASK_FILE : READ_ONLY;
            p->kernel_count++;
        } else if (strcmp(flag, "--carry-rw") == 0 || strcmp(flag, "--carry-ro") == 0) {
            if (p->carry_count == MAX_CARRIED)
                return false;
            p->carry[p->carry_count].path = value;
            p->carry[p->carry_count].read_only = strcmp(flag, "--carry-ro") == 0;
            p->carry_count++;
        } else
            return false;
    }
    return p->workspace && p->state_dir && (p->tmp || strcmp(argv[1], "bare") == 0);
}

/* The keeper's one-time work for all its leases: empty its bounding set, which every lease
 * inherits (the keeper goes on using its effective capabilities; the bounding set only limits
 * what an ``execve`` may grant, and the keeper never executes anything), plan the leases'
 * mounts, and look tmux up. */
static void prepare(plan *p) {
    FILE *last = fopen("/proc/sys/kernel/cap_last_cap", "r");
    int cap_last = -1;
    if (!last || fscanf(last, "%d", &cap_last) != 1 || cap_last < 0)
        die("cannot read /proc/sys/kernel/cap_last_cap");
    fclose(last);
    for (int capability = 0; capability <= cap_last; capability++)
        if (prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0)
            die("cannot drop a bounding capability");
    if (!which("tmux", p->tmux, sizeof p->tmux))
        p->tmux[0] = '\0';
    for (size_t i = 0; i < p->carry_count; i++) {
        carried *c = &p->carry[i];
        if (!exists(c->path))
            die(c->path);
        c->kept = c->read_only ? kept_flags(c->path) : 0;
    }
    p->dev_shm = exists(DEV_SHM);
    p->dev_kept = kept_flags("/dev");
    for (size_t i = 0; i < p->kernel_count; i++) {
        kernel_path *k = &p->kernel[i];
        struct stat info;
        if (stat(k->path, &info) != 0)
            k->how = ABSENT; /* this kernel has no such interface */
        else if (k->how == MASK_FILE && S_ISDIR(info.st_mode))
            k->how = MASK_DIR;
    }
}

/* Send {"ready": false, "error": ...} on the lease's channel and exit; never returns. */
static void refuse(int channel, const char *what) {
    int number = errno;
    buf reply = {0}, text = {0};
    buf_printf(&text, "lease setup failed: %s: %s", what, strerror(number));
    buf_puts(&reply, "{\"ready\":false,\"error\":");
    json_string(&reply, text.data, text.len);
    buf_puts(&reply, "}");
    (void)send_message(channel, &reply);
    _exit(126);
}

static void mount_or_refuse(int channel, const char *source, const char *target,
                            const char *kind, unsigned long flags, const char *data) {
    if (mount(source, target, kind, flags, data) != 0) {
        char what[PATH_MAX + 16];
        snprintf(what, sizeof what, "mount %s", target);
        refuse(channel, what);
    }
}

/* Mount the lease's tmp and /dev/shm: two folders of one fresh tmpfs, so that one size bounds
 * what both hold together. The tmpfs is mounted at tmp, each folder bound where it belongs,
 * tmp's last, over the tmpfs's own root, which no lease sees again. */
static void mount_scratch(int channel, const plan *p) {
    mount_or_refuse(channel, "tmpfs", p->tmp, "tmpfs", MS_NOSUID | MS_NODEV, p->tmpfs);
    char shm[PATH_MAX], tmp[PATH_MAX];
    snprintf(shm, sizeof shm, "%s/shm", p->tmp);
    snprintf(tmp, sizeof tmp, "%s/tmp", p->tmp);
    const char *folders[2][2] = {{shm, DEV_SHM}, {tmp, p->tmp}};
    for (size_t i = p->dev_shm ? 0 : 1; i < 2; i++) {
        if (mkdir(folders[i][0], 0700) != 0 || chmod(folders[i][0], 01777) != 0)
            refuse(channel, folders[i][0]);
        mount_or_refuse(channel, folders[i][0], folders[i][1], NULL, MS_BIND, NULL);
    }
}

/* Become a lease's first process (pid 1 of its new pid namespace) and serve it; never
 * returns. Runs with the keeper's capabilities until it drops them all, before it reads a
 * single request. */
/* The lease's root over an image: an overlay of ``lower`` (the cached tree, read-only) under the
 * lease's writable layer (LAYER_DIR/upper, the slot's own storage, which the server empties at
 * each reset), mounted at LAYER_DIR/root and made the root with pivot_root. /dev and the
 * workspace come along as binds; /proc, /tmp and the rest are mounted by the steps after. */
static const char LAYER_DIR[] = "/run/trajcore/layer";
/* A keeper request's largest size (an image's environment, at most 64 KiB, and the layers'
 * paths: image_sources.py, ENV_MAX_BYTES), and the most read-only layers a lease stacks: the
 * frozen layers of a snapshot chain (snapshots.py, MAX_DEPTH) and the image's tree. */
#define REQUEST_MAX 98304
#define MAX_LOWER_LAYERS 17
/* A lease request's descriptors: its channel and an idmapped clone of each layer. */
#define MAX_DESCRIPTORS (1 + MAX_LOWER_LAYERS)

#ifndef SYS_move_mount
#define SYS_move_mount 429 /* the same number on every architecture */
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif

/* The idmapped clones of the layers (``clones``, ``count`` detached mounts the server made with
 * open_tree and mount_setattr, top first), attached in the lease's own mount namespace at
 * LAYER_DIR/lower-<i> (under the old root, which the pivot detaches), and joined with ':' into
 * ``lower``, which then names them instead of the layers' own paths. */
static void attach_clones(int channel, const int *clones, size_t count, char *lower,
                          size_t size) {
    size_t used = 0;
    for (size_t i = 0; i < count; i++) {
        char point[PATH_MAX];
        snprintf(point, sizeof point, "%s/lower-%zu", LAYER_DIR, i);
        if (mkdir(point, 0700) != 0 && errno != EEXIST)
            refuse(channel, point);
        if (syscall(SYS_move_mount, clones[i], "", AT_FDCWD, point, MOVE_MOUNT_F_EMPTY_PATH) != 0)
            refuse(channel, "attach an idmapped layer");
        int n = snprintf(lower + used, size - used, "%s%s", i ? ":" : "", point);
        if (n < 0 || (size_t)n >= size - used) {
            errno = ENAMETOOLONG;
            refuse(channel, "overlay layers");
        }
        used += (size_t)n;
        close(clones[i]);
    }
}

/* Whether the folder at ``path`` holds nothing (false when it cannot be read). */
static bool empty_folder(const char *path) {
    DIR *folder = opendir(path);
    if (!folder)
        return false;
    bool empty = true;
    for (struct dirent *entry; empty && (entry = readdir(folder));)
        empty = strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0;
    closedir(folder);
    return empty;
}

/* ``lower``: the overlay's read-only layers, top first, joined with ':' (join_layers); with
 * ``count`` idmapped ``clones`` of them, those are mounted instead (attach_clones). */
static void enter_image(int channel, const plan *p, const char *lower, const int *clones,
                        size_t count) {
    if (strpbrk(lower, ",\\") || lower[0] != '/') {
        errno = EINVAL;
        refuse(channel, "the image's tree (a path with ',' or '\\')");
    }
    char upper[PATH_MAX], work[PATH_MAX], root[PATH_MAX], options[REQUEST_MAX + 3 * PATH_MAX];
    snprintf(upper, sizeof upper, "%s/upper", LAYER_DIR);
    snprintf(work, sizeof work, "%s/work", LAYER_DIR);
    snprintf(root, sizeof root, "%s/root", LAYER_DIR);
    const char *made[] = {upper, work, root};
    for (size_t i = 0; i < 3; i++)
        if (mkdir(made[i], 0755) != 0 && errno != EEXIST)
            refuse(channel, made[i]);
    static char attached[REQUEST_MAX];
    if (count > 0) {
        attach_clones(channel, clones, count, attached, sizeof attached);
        lower = attached;
    }
    /* The writable layer is thrown away at the lease's reset (or frozen by a snapshot once the
     * lease's processes have ended, read through the page cache): the overlay is volatile, so
     * it never syncs the upper file system, and its unmount at the lease's end flushes no disk
     * (5-8 ms of a reset otherwise). A volatile mount leaves a mark in its work folder that
     * refuses any later mount over it: a work folder an earlier overlay used (a lease going on
     * in its epoch over its layer or its snapshot) is set aside, for the reset to discard with
     * the layer, and a fresh one made. A kernel before 5.10 refuses the option. */
    bool volatile_layer = empty_folder(work);
    if (!volatile_layer) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        char aside[PATH_MAX];
        snprintf(aside, sizeof aside, "%s/work-%lld%09ld", LAYER_DIR, (long long)now.tv_sec,
                 now.tv_nsec);
        if (rename(work, aside) != 0 || mkdir(work, 0755) != 0)
            refuse(channel, "set the overlay's used work folder aside");
        volatile_layer = true;
    }
    int n = snprintf(options, sizeof options, "lowerdir=%s,upperdir=%s,workdir=%s,userxattr%s",
                     lower, upper, work, volatile_layer ? ",volatile" : "");
    if (n < 0 || (size_t)n >= sizeof options) {
        errno = ENAMETOOLONG;
        refuse(channel, "overlay options");
    }
    if (mount("overlay", root, "overlay", MS_NOSUID | MS_NODEV, options) != 0) {
        if (!volatile_layer || errno != EINVAL)
            refuse(channel, "mount the overlay");
        options[n - strlen(",volatile")] = '\0';
        mount_or_refuse(channel, "overlay", root, "overlay", MS_NOSUID | MS_NODEV, options);
    }
    if (chdir(root) != 0)
        refuse(channel, root);
    /* mount points in the new root (the overlay's root is the lease's own directory) */
    const char *points[] = {"proc", "dev", "tmp"};
    for (size_t i = 0; i < sizeof points / sizeof *points; i++)
        if (mkdir(points[i], 0755) != 0 && errno != EEXIST)
            refuse(channel, points[i]);
    char inside[2 * PATH_MAX];
    snprintf(inside, sizeof inside, "%s%s", root, p->workspace);
    make_dirs(inside);
    mount_or_refuse(channel, "/dev", "dev", NULL, MS_BIND | MS_REC, NULL);
    mount_or_refuse(channel, p->workspace, p->workspace + 1, NULL, MS_BIND | MS_REC, NULL);
    /* the lease's fresh /proc, mounted while the sandbox's own is still visible (the kernel
     * refuses a proc mount in a user namespace that sees no unmasked proc) */
    mount_or_refuse(channel, "proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    if (syscall(SYS_pivot_root, ".", ".") != 0)
        refuse(channel, "pivot_root");
    /* the old root is stacked on the new one: detach it, so nothing of it stays reachable */
    if (umount2(".", MNT_DETACH) != 0)
        refuse(channel, "detach the old root");
    if (chdir("/") != 0)
        refuse(channel, "chdir /");
}

/* Bring up the loopback of the calling process's (new) network namespace; false on failure. */
static bool loopback_up(void) {
    int probe = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq loopback = {.ifr_name = "lo"};
    loopback.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
    bool up = probe >= 0 && ioctl(probe, SIOCSIFFLAGS, &loopback) == 0;
    if (probe >= 0)
        close(probe);
    return up;
}

/* The first steps of a lease's setup, which need nothing of its request: new mount, ipc, uts
 * and (with --own-network) network namespaces, the network's loopback up, and a session keyring
 * of its own (nothing from whoever started the server; the filter then refuses every keyring
 * call). Its mounts stay as the keeper's namespace had them, and receive what the server mounts
 * on the host (a fork's workspace overlay) until lease_main makes them private. Returns what
 * failed, or NULL. */
static const char *lease_namespaces(const plan *p) {
    if (unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | (p->own_network ? CLONE_NEWNET : 0)) !=
        0)
        return "unshare";
    if (p->own_network && !loopback_up()) /* nothing else exists in a new one */
        return "bring up lo";
    if (syscall(SYS_keyctl, 1 /* KEYCTL_JOIN_SESSION_KEYRING */, NULL) < 0 && errno != ENOSYS)
        return "join a new session keyring";
    return NULL;
}

/* The environment of a lease over an image whose config sets variables (``size`` bytes at
 * ``env``: NAME=VALUE entries, NUL-separated): the image's variables are the base; HOME and
 * TMPDIR stay the keeper's (the workspace and the lease's tmp), and PATH, LANG and TERM the
 * keeper's only where the image sets none, as docs/environments.md says. Refuses the lease on
 * an entry that does not read NAME=VALUE (the server checked them when it read the image). */
static void apply_image_env(int channel, const char *env, size_t size) {
    static const char *const kept_names[] = {"HOME", "TMPDIR", "PATH", "LANG", "TERM"};
    enum { KEPT = sizeof kept_names / sizeof kept_names[0], ALWAYS = 2 };
    char *kept[KEPT];
    for (size_t i = 0; i < KEPT; i++) {
        const char *value = getenv(kept_names[i]);
        kept[i] = value ? strdup(value) : NULL;
        if (value && !kept[i])
            refuse(channel, "the image's environment");
    }
    if (clearenv() != 0)
        refuse(channel, "the image's environment");
    static char name[REQUEST_MAX];
    for (size_t offset = 0; offset < size;) {
        const char *entry = env + offset;
        size_t length = strnlen(entry, size - offset);
        const char *equals = memchr(entry, '=', length);
        if (!equals || equals == entry) {
            errno = EINVAL;
            refuse(channel, "the image's environment (an entry that is not NAME=VALUE)");
        }
        memcpy(name, entry, (size_t)(equals - entry));
        name[equals - entry] = '\0'; /* its value ends at its NUL, or the request's (NUL-ended) */
        if (setenv(name, equals + 1, 1) != 0)
            refuse(channel, "the image's environment");
        offset += length + 1;
    }
    for (size_t i = 0; i < KEPT; i++) {
        if (kept[i] && setenv(kept_names[i], kept[i], i < ALWAYS) != 0)
            refuse(channel, "the image's environment");
        free(kept[i]);
    }
}

/* The rest of a lease's setup (after lease_namespaces), from its request: its channel, the image's
 * tree or layers and their clones; then it serves the lease. Never returns. */
static void lease_main(int channel, const plan *p, const char *image, const char *env,
                       size_t env_size, const int *clones, size_t count) {
    mount_or_refuse(channel, NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    /* The carried paths, held open before the fresh tmpfs (or the image's root) hides them:
     * descriptors opened here, in the lease's own mount namespace (a bind from another
     * namespace's mount is refused). */
    int held[MAX_CARRIED];
    for (size_t i = 0; i < p->carry_count; i++) {
        held[i] = open(p->carry[i].path, O_PATH | O_CLOEXEC);
        if (held[i] < 0)
            refuse(channel, p->carry[i].path);
    }
    char tmux[PATH_MAX];
    snprintf(tmux, sizeof tmux, "%s", p->tmux);
    if (image) {
        enter_image(channel, p, image, clones, count);
        if (env_size > 0)
            apply_image_env(channel, env, env_size);
        /* the image's own, if it has one (on the image's PATH, where it sets one) */
        if (!which("tmux", tmux, sizeof tmux))
            tmux[0] = '\0';
    }
    else
        mount_or_refuse(channel, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    /* The fresh /proc's kernel interfaces: masked, or read-only (the host's sysctls among them) */
    for (size_t i = 0; i < p->kernel_count; i++) {
        const kernel_path *k = &p->kernel[i];
        if (k->how == MASK_FILE)
            mount_or_refuse(channel, "/dev/null", k->path, NULL, MS_BIND, NULL);
        else if (k->how == MASK_DIR)
            mount_or_refuse(channel, "tmpfs", k->path, "tmpfs",
                            MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0,mode=0555");
        else if (k->how == READ_ONLY) {
            mount_or_refuse(channel, k->path, k->path, NULL, MS_BIND | MS_REC, NULL);
            mount_or_refuse(channel, NULL, k->path, NULL,
                            MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                            NULL);
        }
    }
    mount_scratch(channel, p);
    for (size_t i = 0; i < p->carry_count; i++) {
        const carried *c = &p->carry[i];
        char source[64];
        snprintf(source, sizeof source, "/proc/self/fd/%d", held[i]);
        make_dirs(c->path);
        mount_or_refuse(channel, source, c->path, NULL, MS_BIND | MS_REC, NULL);
        if (c->read_only)
            mount_or_refuse(channel, NULL, c->path, NULL,
                            MS_REMOUNT | MS_BIND | MS_RDONLY | c->kept, NULL);
        close(held[i]);
    }
    mount_or_refuse(channel, NULL, "/dev", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | p->dev_kept,
                    NULL);
    /* The bounding set is empty already (the keeper emptied its own): what is left is the
     * keeper's ambient, permitted and effective sets. A kernel without ambient capabilities
     * has none to clear. */
    (void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct {
        uint32_t version;
        int pid;
    } header = {0x20080522 /* _LINUX_CAPABILITY_VERSION_3 */, 0};
    struct {
        uint32_t effective, permitted, inheritable;
    } none[2] = {{0, 0, 0}, {0, 0, 0}};
    if (syscall(SYS_capset, &header, none) != 0)
        refuse(channel, "capset");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        refuse(channel, "no_new_privs");
    /* no one of the lease (same uid) may read its memory or take its channel through /proc */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
        refuse(channel, "dumpable");
    /* the channel first: a descriptor below 3 would be overwritten by /dev/null */
    if (channel != LEASE_FD && dup2(channel, LEASE_FD) < 0)
        refuse(channel, "dup2");
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0)
        refuse(LEASE_FD, "open /dev/null");
    for (int target = 0; target < 3; target++)
        if (dup2(null, target) < 0)
            refuse(LEASE_FD, "dup2");
    (void)fcntl(LEASE_FD, F_SETFD, FD_CLOEXEC);
#ifdef SYS_close_range
    if (syscall(SYS_close_range, LEASE_FD + 1, ~0U, 0) != 0)
#endif
    {
        for (int fd = LEASE_FD + 1; fd < 65536; fd++) /* kernels before 5.9 */
            (void)close(fd);
    }
    for (size_t i = 0; i < p->limit_count; i++) {
        struct rlimit limit = {p->limits[i].value, p->limits[i].value};
        if (setrlimit(p->limits[i].resource, &limit) != 0)
            refuse(LEASE_FD, "setrlimit");
    }
    /* the last step of the setup: the seccomp filter (no_new_privs is set) */
    if (p->filter) {
        struct sock_fprog program = {(unsigned short)p->filter_length, p->filter};
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0) != 0)
            refuse(LEASE_FD, "seccomp");
    }
    _exit(serve(LEASE_FD, p->state_dir, p->workspace, tmux, true));
}

/* Kill a lease's first process, and so its whole pid namespace, and reap it: as pid 1 of that
 * namespace it is reapable only once the kernel has killed and reaped every other process of
 * the lease. Returns its wait status. */
static int end_lease(pid_t first) {
    (void)kill(first, SIGKILL);
    int status = 0;
    wait_for_child(first, &status);
    return status;
}

/* Start a lease: fork its first process straight into a new pid namespace (clone with
 * CLONE_NEWPID, so the keeper's own namespaces never change: an unprivileged sandbox may not
 * setns back into its pid namespace). Returns its pid as the keeper sees it, or -1 (errno
 * set). */
static pid_t begin_lease(int channel, const plan *p, const char *image, const char *env,
                         size_t env_size, const int *clones, size_t count) {
    pid_t first = (pid_t)syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, NULL, NULL, NULL, NULL);
    if (first == 0) {
        const char *failed = lease_namespaces(p);
        if (failed)
            refuse(channel, failed);
        lease_main(channel, p, image, env, env_size, clones, count);
    }
    return first;
}

/* Receive one request packet on ``fd`` (a SOCK_SEQPACKET socket; interrupted calls retried):
 * at most ``size`` - 1 bytes into ``message``, NUL-terminated, and the SCM_RIGHTS descriptors
 * that came with it (close-on-exec, at most MAX_DESCRIPTORS) into ``fds``, ``*fd_count`` of
 * them. Returns the packet's length: 0 at end of input, -1 on an error (errno set); a length of
 * ``size`` or more is a packet over the limit, of which ``message`` holds the first bytes only
 * (the rest is gone): its caller refuses it, never acts on what was cut short. */
static ssize_t receive_request(int fd, char *message, size_t size, int *fds, size_t *fd_count) {
    union {
        char room[CMSG_SPACE(MAX_DESCRIPTORS * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct iovec part = {message, size - 1};
    struct msghdr header = {.msg_iov = &part, .msg_iovlen = 1, .msg_control = control.room,
                            .msg_controllen = sizeof control.room};
    ssize_t got;
    do /* MSG_TRUNC: the datagram's whole length, also of one cut to ``size - 1`` bytes */
        got = recvmsg(fd, &header, MSG_CMSG_CLOEXEC | MSG_TRUNC);
    while (got < 0 && errno == EINTR);
    *fd_count = 0;
    for (struct cmsghdr *c = got > 0 ? CMSG_FIRSTHDR(&header) : NULL; c;
         c = CMSG_NXTHDR(&header, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count && *fd_count < MAX_DESCRIPTORS; i++)
                memcpy(&fds[(*fd_count)++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }
    }
    if (got >= 0)
        message[(size_t)got < size ? (size_t)got : size - 1] = '\0';
    return got;
}

/* ------------------------------------------------------------------------ readied leases
 *
 * While the slot is idle, the keeper readies its next lease when the server asks ("ready", sent
 * once a reset has proven the slot clean, or a keeper started: no process of any tenant is
 * left): it clones the lease's first process into a new pid namespace, which makes its other
 * namespaces (lease_namespaces), says so with one byte, and waits for its request on a socket of
 * its own. A lease request then only hands it the request (its layers, its channel and clones)
 * and answers with its pid; the process goes on with the setup every lease gets (lease_main).
 * Nothing of a tenant reaches it: it is made while no lease runs ("ready" during a lease is
 * ignored) and consumed by exactly one lease; a lease request while a lease runs drops it, and
 * one that finds it dead or failed clones a fresh lease as before. It dies with the keeper
 * (PR_SET_PDEATHSIG). The answer to a lease request says whether the readied process took it
 * ("readied": true): one that dies after the hand-over (killed, out of memory) ends the lease's
 * channel before its greeting, and the server asks for a fresh lease at once (sandboxes.py,
 * lease_agent); the keeper reaps it at that lease's "end". */
#define READIED_WAIT_S 5.0

static void readied_main(int socket_fd, const plan *p) {
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    const char *failed = lease_namespaces(p);
    (void)prctl(PR_SET_NAME, "slot-readied", 0, 0, 0); /* its namespaces made; "slot-lease" */
    char byte = failed ? 'n' : 'y';
    if (send(socket_fd, &byte, 1, 0) != 1 || failed)
        _exit(3);
    static char message[REQUEST_MAX];
    int fds[MAX_DESCRIPTORS];
    size_t fd_count = 0;
    ssize_t got = receive_request(socket_fd, message, sizeof message, fds, &fd_count);
    if (got <= 0 || (size_t)got >= sizeof message || fd_count == 0)
        _exit(3);
    close(socket_fd);
    /* the keeper checked the request: "-" (the server's root), else "L" and the joined layers,
     * then, where the image sets variables, NUL and its environment (NUL-separated) */
    const char *image = got > 1 ? message + 1 : NULL, *env = NULL;
    size_t env_size = 0;
    if (image) {
        size_t lowers = strnlen(image, (size_t)got - 1);
        if (1 + lowers + 1 < (size_t)got) {
            env = image + lowers + 1;
            env_size = (size_t)got - 2 - lowers;
        }
    }
    lease_main(fds[0], p, image, env, env_size, fds + 1, fd_count - 1);
}

/* Drop the readied lease, if any: kill and reap it. */
static void drop_readied(plan *p) {
    if (p->readied > 0)
        end_lease(p->readied);
    if (p->readied_socket >= 0)
        close(p->readied_socket);
    p->readied = 0;
    p->readied_socket = -1;
}

/* Ready the next lease (above) unless one is readied; nothing when anything fails (the next
 * lease request then clones a fresh one). */
static void ready_next(plan *p) {
    int status;
    if (p->readied > 0 && waitpid(p->readied, &status, WNOHANG) == 0)
        return; /* readied already, and alive */
    if (p->readied > 0) { /* killed (a reset's proof of an empty slot): reaped just now */
        p->readied = 0;
        drop_readied(p);
    }
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0)
        return;
    pid_t first = (pid_t)syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, NULL, NULL, NULL, NULL);
    if (first == 0) {
        close(pair[0]);
        readied_main(pair[1], p);
    }
    close(pair[1]);
    if (first < 0) {
        close(pair[0]);
        return;
    }
    p->readied = first;
    p->readied_socket = pair[0];
}

/* Start a lease in the readied process: wait (at most READIED_WAIT_S) for its byte saying its
 * namespaces are made, then hand it the request ("-": the server's root, or "L" and the joined
 * layers) with the descriptors. Returns its pid, or -1 when it has none to offer (dropped; the caller clones a
 * fresh one). */
static pid_t use_readied(plan *p, const char *image, const char *env, size_t env_size,
                         const int *fds, size_t fd_count) {
    if (p->readied <= 0)
        return -1;
    struct pollfd wait = {p->readied_socket, POLLIN, 0};
    char byte = 0;
    int ready;
    do
        ready = poll(&wait, 1, (int)(READIED_WAIT_S * 1000));
    while (ready < 0 && errno == EINTR);
    if (ready != 1 || recv(p->readied_socket, &byte, 1, 0) != 1 || byte != 'y') {
        drop_readied(p);
        return -1;
    }
    static char message[REQUEST_MAX + 1];
    size_t length = 1;
    message[0] = 'L';
    if (image) {
        length += strlen(image);
        memcpy(message + 1, image, length - 1);
        if (env_size > 0 && length + 1 + env_size < REQUEST_MAX) { /* readied_main's size */
            message[length] = '\0';
            memcpy(message + length + 1, env, env_size);
            length += 1 + env_size;
        } else if (env_size > 0) {
            drop_readied(p); /* cannot be handed over: a fresh lease takes it */
            return -1;
        }
    }
    union {
        char room[CMSG_SPACE(MAX_DESCRIPTORS * sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct iovec part = {message, image ? length : 1};
    if (!image)
        message[0] = '-';
    struct msghdr header = {.msg_iov = &part, .msg_iovlen = 1, .msg_control = control.room,
                            .msg_controllen = CMSG_SPACE(fd_count * sizeof(int))};
    struct cmsghdr *c = CMSG_FIRSTHDR(&header);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fd_count * sizeof(int));
    memcpy(CMSG_DATA(c), fds, fd_count * sizeof(int));
    if (sendmsg(p->readied_socket, &header, MSG_NOSIGNAL) != (ssize_t)part.iov_len) {
        drop_readied(p);
        return -1;
    }
    pid_t first = p->readied;
    close(p->readied_socket);
    p->readied = 0;
    p->readied_socket = -1;
    return first;
}

/* The read-only layers of a "lease-image" or "lease-fork" request (``size`` bytes at ``at``,
 * NUL-separated), joined with ':' for the overlay's lowerdir; NULL with ``problem`` set when a
 * path is not absolute, is empty or holds ',', ':' or '\\' (the overlay's separators), or when
 * there are too many (a fork: two at least, the frozen layers and the image's tree). */
static const char *join_layers(const char *at, size_t size, bool fork, const char **problem,
                               size_t *layers) {
    static char lowers[REQUEST_MAX];
    size_t used = 0, count = 0, offset = 0;
    while (offset < size) {
        const char *part = at + offset;
        size_t len = strnlen(part, size - offset);
        if (len == 0 || part[0] != '/' || memchr(part, ',', len) || memchr(part, ':', len) ||
            memchr(part, '\\', len)) {
            *problem = "keeper refused the lease: a layer's path must be absolute, without ',', "
                       "':' or '\\'";
            return NULL;
        }
        if (++count > (fork ? MAX_LOWER_LAYERS : 1)) {
            *problem = "keeper refused the lease: too many layers";
            return NULL;
        }
        if (count > 1)
            lowers[used++] = ':';
        memcpy(lowers + used, part, len);
        used += len;
        offset += len + 1;
    }
    if (count < (fork ? 2u : 1u)) {
        *problem = "keeper refused the lease: a fork names its frozen layers and the image's tree";
        return NULL;
    }
    lowers[used] = '\0';
    *layers = count;
    return lowers;
}

/* Run as a slot's keeper: requests arrive on fd 0, a
 * SOCK_SEQPACKET socket, one per packet: "lease" (with the lease's channel as an SCM_RIGHTS
 * descriptor) or "end"; each gets one JSON packet back. End of input ends the current lease and
 * the keeper. */
static int keep(plan *p) {
    p->readied = 0;
    p->readied_socket = -1;
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* a lease (same uid) cannot reach the keeper */
    prepare(p);
    (void)sched_setscheduler(0, SCHED_BATCH, &(struct sched_param){0});
    (void)prctl(PR_SET_NAME, "slot-keeper", 0, 0, 0);
    signal(SIGPIPE, SIG_IGN);
    buf reply = {0};
    buf_printf(&reply, "{\"ready\":true,\"pid\":%d}", (int)getpid());
    if (send(0, reply.data, reply.len, 0) < 0)
        return 0;
    pid_t lease = 0;
    while (true) {
        char message[REQUEST_MAX];
        int fds[MAX_DESCRIPTORS];
        size_t fd_count = 0;
        ssize_t got = receive_request(0, message, sizeof message, fds, &fd_count);
        if (got <= 0) {
            if (lease > 0)
                end_lease(lease);
            drop_readied(p);
            return 0;
        }
        reply.len = 0;
        /* "lease"; "lease-image" NUL the image's tree: a lease over that image; or "lease-fork"
         * NUL a snapshot's frozen layers (top first, NUL-separated) NUL the image's tree: a
         * lease over those layers stacked on the image; either, then, an empty field and the
         * image's environment (apply_image_env). The lease's channel is the first
         * descriptor; a lease over layers may bring an idmapped clone of each after it, in the
         * same order (attach_clones), or none (the layers' own paths) */
        const char *image = NULL, *problem = NULL, *env = NULL;
        bool over = (size_t)got >= sizeof message; /* only its head came: refused whole */
        bool leasing = got == 5 && memcmp(message, "lease", 5) == 0;
        size_t head = 0, layers = 0, env_size = 0;
        if (got > 12 && memcmp(message, "lease-image\0", 12) == 0)
            head = 12;
        else if (got > 11 && memcmp(message, "lease-fork\0", 11) == 0)
            head = 11;
        if (head > 0 && !over) {
            /* the layers end at an empty field, where the image's environment follows */
            size_t body = (size_t)got - head;
            const char *split = memmem(message + head, body, "\0\0", 2);
            if (split) {
                env = split + 2;
                env_size = (size_t)(message + got - env);
                body = (size_t)(split - (message + head));
            }
            image = join_layers(message + head, body, head == 11, &problem, &layers);
            leasing = true;
        }
        if (over) {
            /* a lease over an image whose layers' paths and environment (``Env``) together
             * pass REQUEST_MAX: acting on its head would drop variables, or cut one short */
            buf text = {0};
            buf_puts(&text, "the keeper's request ");
            json_string(&text, message, strnlen(message, 16));
            buf_printf(&text, " is %zd bytes, over the keeper's limit of %zu bytes: refused "
                              "whole, nothing was done (a lease over an image carries its "
                              "layers' paths and the image's environment, its Env)",
                       got, sizeof message - 1);
            buf_puts(&reply, "{\"error\":");
            json_string(&reply, text.data, text.len);
            buf_puts(&reply, "}");
            buf_free(&text);
        } else if (leasing && problem) {
            buf_puts(&reply, "{\"error\":");
            json_string(&reply, problem, strlen(problem));
            buf_puts(&reply, "}");
        } else if (leasing) {
            if (fd_count != 1 && fd_count != 1 + layers) {
                buf_printf(&reply,
                           "{\"error\":\"a lease needs one channel (and one idmapped clone per "
                           "layer, or none), got %zu descriptors for %zu layers\"}",
                           fd_count, layers);
            } else {
                if (lease > 0) { /* no "end" came: the readied lease saw this tenant's time */
                    end_lease(lease);
                    drop_readied(p);
                }
                lease = use_readied(p, image, env, env_size, fds, fd_count);
                bool readied = lease > 0; /* the server starts a fresh lease if it died */
                if (lease <= 0)
                    lease = begin_lease(fds[0], p, image, env, env_size, fds + 1, fd_count - 1);
                if (lease > 0) {
                    buf_printf(&reply, "{\"lease\":true,\"pid\":%d,\"readied\":%s}", (int)lease,
                               readied ? "true" : "false");
                } else {
                    buf text = {0};
                    buf_printf(&text, "keeper failed: cannot start a lease: %s", strerror(errno));
                    buf_puts(&reply, "{\"error\":");
                    json_string(&reply, text.data, text.len);
                    buf_puts(&reply, "}");
                    buf_free(&text);
                    lease = 0;
                }
            }
        } else if (got == 3 && memcmp(message, "end", 3) == 0) {
            if (lease > 0)
                buf_printf(&reply, "{\"ended\":true,\"status\":%d}", end_lease(lease));
            else
                buf_puts(&reply, "{\"ended\":true,\"status\":null}");
            lease = 0;
        } else if (got == 5 && memcmp(message, "ready", 5) == 0) {
            /* the server asks once the slot is proven clean (never while a lease runs) */
            if (lease <= 0)
                ready_next(p);
            if (p->readied > 0)
                buf_printf(&reply, "{\"readied\":true,\"pid\":%d}", (int)p->readied);
            else
                buf_puts(&reply, "{\"readied\":false}");
        } else {
            buf text = {0};
            buf_puts(&text, "unknown op ");
            json_string(&text, message, (size_t)got);
            buf_puts(&reply, "{\"error\":");
            json_string(&reply, text.data, text.len);
            buf_puts(&reply, "}");
            buf_free(&text);
        }
        for (size_t i = 0; i < fd_count; i++)
            close(fds[i]);
        if (send(0, reply.data, reply.len, 0) < 0) {
            if (lease > 0)
                end_lease(lease);
            drop_readied(p);
            return 0;
        }
    }
}

/* Run as an unsandboxed slot's agent on fd 0 (the server's end of a socket pair): no
 * namespaces to enter, so the only setup is the limits, the scheduling class and the name. */
static int bare(plan *p) {
    for (size_t i = 0; i < p->limit_count; i++) {
        struct rlimit limit = {p->limits[i].value, p->limits[i].value};
        if (setrlimit(p->limits[i].resource, &limit) != 0) {
            fprintf(stderr, "slot-helper: cannot set a resource limit: %s\n", strerror(errno));
            return 2;
        }
    }
    (void)sched_setscheduler(0, SCHED_BATCH, &(struct sched_param){0});
    if (!which("tmux", p->tmux, sizeof p->tmux))
        p->tmux[0] = '\0';
    return serve(0, p->state_dir, p->workspace, p->tmux, false);
}

/* ``userns COUNT`` (the usage above): for the server's idmapped mounts, which each take a user
 * namespace mapping an owner to a slot's ids. A child of this program is a few hundred
 * microseconds where an interpreter takes a tenth of a second. */
static int userns_main(const char *count_text) {
    char *end;
    errno = 0;
    long count = strtol(count_text, &end, 10);
    if (errno || *end || end == count_text || count < 1 || count > 65536) {
        fprintf(stderr, "slot-helper: userns takes a count from 1 to 65536\n");
        return 2;
    }
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) != 0)
        die("pipe");
    pid_t *children = calloc((size_t)count, sizeof *children);
    if (!children)
        out_of_memory();
    long made = 0;
    int failure = 0;
    for (; made < count; made++) {
        pid_t child = fork();
        if (child < 0) {
            failure = errno;
            break;
        }
        if (child == 0) {
            (void)prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
            close(ready[0]);
            int result = unshare(CLONE_NEWUSER) == 0 ? 0 : errno;
            if (write(ready[1], &result, sizeof result) != (ssize_t)sizeof result || result)
                _exit(3);
            close(ready[1]);
            for (char byte;;) { /* until stdin ends */
                ssize_t got = read(0, &byte, 1);
                if (got == 0 || (got < 0 && errno != EINTR))
                    _exit(0);
            }
        }
        children[made] = child;
    }
    close(ready[1]);
    for (long heard = 0; heard < made && !failure;) {
        int result = 0;
        ssize_t got = read(ready[0], &result, sizeof result);
        if (got < 0 && errno == EINTR)
            continue;
        if (got != (ssize_t)sizeof result)
            failure = EIO;
        else if (result)
            failure = result;
        heard++;
    }
    close(ready[0]);
    if (failure) {
        fprintf(stderr, "slot-helper: cannot make a user namespace: %s\n", strerror(failure));
        for (long i = 0; i < made; i++)
            (void)kill(children[i], SIGKILL);
    } else {
        for (long i = 0; i < made; i++)
            printf("%s%d", i ? " " : "", (int)children[i]);
        printf("\n");
        fflush(stdout);
    }
    for (long i = 0; i < made; i++) {
        int status;
        wait_for_child(children[i], &status);
    }
    free(children);
    return failure ? 3 : 0;
}

/* ============================================================================ main */

/* One id of ``--ids``: decimal digits only, from 1 to 4294967294 (0 is root's, -1 means "unchanged"
 * to the set*id calls). */
static bool parse_one_id(const char *text, size_t length, unsigned long *out) {
    if (length == 0 || length > 10)
        return false;
    unsigned long value = 0;
    for (size_t i = 0; i < length; i++) {
        if (text[i] < '0' || text[i] > '9')
            return false;
        value = value * 10 + (unsigned long)(text[i] - '0');
    }
    if (value == 0 || value >= 4294967295UL)
        return false;
    *out = value;
    return true;
}

/* ``--ids UID:GID PROGRAM [ARG]...`` (the usage below): become UID and GID, with no
 * supplementary group, check that every id took (real, effective and saved), then exec PROGRAM
 * (a bare name is looked up on the environment's PATH) with the rest. The server starts a
 * slot's sandbox this way so that its own start can be a vfork (Python's subprocess forks the
 * whole server when it is given a user or a group), the drop happening here, in the child.
 * Refuses, exit status 2, on a bad value or an id not taken. */
static int ids_main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "slot-helper: --ids takes UID:GID and then a program to run\n");
        return 2;
    }
    const char *text = argv[2];
    const char *colon = strchr(text, ':');
    unsigned long uid_value, gid_value;
    if (!colon || !parse_one_id(text, (size_t)(colon - text), &uid_value) ||
        !parse_one_id(colon + 1, strlen(colon + 1), &gid_value)) {
        fprintf(stderr,
                "slot-helper: --ids '%s': not UID:GID (two decimal ids, each from 1 to "
                "4294967294; root's 0 is refused)\n",
                text);
        return 2;
    }
    uid_t uid = (uid_t)uid_value;
    gid_t gid = (gid_t)gid_value;
    if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0) {
        fprintf(stderr, "slot-helper: --ids %s: cannot take the ids: %s\n", text, strerror(errno));
        return 2;
    }
    uid_t ruid, euid, suid;
    gid_t rgid, egid, sgid;
    if (getresuid(&ruid, &euid, &suid) != 0 || getresgid(&rgid, &egid, &sgid) != 0 ||
        ruid != uid || euid != uid || suid != uid || rgid != gid || egid != gid || sgid != gid ||
        getgroups(0, NULL) != 0) {
        fprintf(stderr, "slot-helper: --ids %s: the ids did not take; refusing to go on\n", text);
        return 2;
    }
    execvp(argv[3], argv + 3); /* a bare name: looked up on PATH, as the slot's uid */
    fprintf(stderr, "slot-helper: --ids: cannot start %s: %s\n", argv[3], strerror(errno));
    return 127;
}

static int usage(void) {
    fprintf(stderr,
            "usage: slot-helper keep --workspace W --state-dir S --tmp T [--limit NAME VALUE]...\n"
            "                        [--carry-rw PATH]... [--carry-ro PATH]...\n"
            "                        [--mask PATH]... [--read-only PATH]...\n"
            "                        [--tmpfs-options OPTIONS] [--own-network] [--seccomp HEX]\n"
            "                        [--command-nproc N]\n"
            "       slot-helper serve CHANNEL_FD STATE_DIR WORKSPACE TMUX_PATH_OR_EMPTY\n"
            "       slot-helper bare --workspace W --state-dir S [--limit NAME VALUE]...\n"
            "                        [--command-nproc N]\n"
            "       slot-helper userns COUNT\n"
            "       slot-helper --ids UID:GID PROGRAM [ARG]...\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--ids") == 0)
        return ids_main(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "keep") == 0) {
        plan p = {0};
        if (!parse_plan(argc, argv, &p))
            return usage();
        return keep(&p);
    }
    if (argc == 6 && strcmp(argv[1], "serve") == 0) {
        char *end;
        long channel = strtol(argv[2], &end, 10);
        if (*end || end == argv[2] || channel < 0 || channel > INT_MAX ||
            fcntl((int)channel, F_GETFD) < 0) {
            fprintf(stderr, "slot-helper: %s is not an open descriptor\n", argv[2]);
            return 2;
        }
        return serve((int)channel, argv[3], argv[4], argv[5], true);
    }
    if (argc == 3 && strcmp(argv[1], "userns") == 0)
        return userns_main(argv[2]);
    if (argc >= 2 && strcmp(argv[1], "bare") == 0) {
        plan p = {0};
        if (!parse_plan(argc, argv, &p) || p.tmp || p.carry_count || p.kernel_count ||
            p.filter || p.own_network)
            return usage();
        return bare(&p);
    }
    return usage();
}
