/* The least a tool-call server can do: bench/env_floor.py's other end.
 *
 *   responder HOLD_US [UNIX_PATH]
 *       Listens on 127.0.0.1 (a port the kernel picks, printed as one line of JSON on stdout:
 *       {"port": P}), or on the Unix socket UNIX_PATH ({"port": 0}), accepts any number of connections and serves them from one thread with
 *       epoll. A request is a frame: a 4-byte big-endian body length, a 4-byte big-endian count
 *       of calls, then the body (the batch's JSON, which is not read). The answer is a frame of
 *       a 4-byte big-endian length and the body {"results":[R,...]} with one fixed result R per
 *       call, the shape of a slot server's result of `true` (exit 0, empty output). Nothing is
 *       spawned. With HOLD_US > 0 each answer leaves HOLD_US microseconds after its request
 *       arrived (a timerfd; waiting costs no CPU), which stands in for the command's own time so
 *       that the calls of many trajectories pile up into full batches, as they do in trajcore.
 *
 * It runs until it is killed (SIGTERM) or its standard input reaches end of file. A failure
 * prints what failed and exits 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum { MAX_CONNECTIONS = 256, MAX_PENDING = 1 << 14, MAX_CALLS = 4096 };

static const char RESULT[] =
    "{\"call_id\":\"c\",\"name\":\"bash\",\"outcome\":\"ok\",\"content\":\"exit 0\","
    "\"error\":null,\"exec\":{\"exit_code\":0,\"stdout\":\"\",\"stderr\":\"\","
    "\"stdout_dropped\":0,\"stderr_dropped\":0,\"timed_out\":false,\"duration_s\":0.001,"
    "\"sandboxed\":true}}";

typedef struct {
    int fd;
    char *in;
    size_t have, capacity;
} connection;

typedef struct {
    int fd;
    uint32_t calls;
    struct timespec due;
} pending;

static connection connections[MAX_CONNECTIONS];
static pending queue[MAX_PENDING]; /* answers held back, in order of their due times */
static size_t queue_head, queue_size;
static char *answer;               /* "{\"results\":[" R "," R ... "]}" for MAX_CALLS calls */

static void die(const char *what) {
    fprintf(stderr, "responder: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void put32(char *at, uint32_t value) {
    at[0] = (char)(value >> 24);
    at[1] = (char)(value >> 16);
    at[2] = (char)(value >> 8);
    at[3] = (char)value;
}

static uint32_t get32(const char *at) {
    const unsigned char *u = (const unsigned char *)at;
    return (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3];
}

/* The answer to `calls` calls: a frame written into `answer`'s own buffer (its prefix). */
static void send_answer(int fd, uint32_t calls) {
    static char frame[8 + 16 + MAX_CALLS * sizeof RESULT];
    size_t result = sizeof RESULT - 1, body = 12 + calls * (result + 1) + 1;
    put32(frame, (uint32_t)body);
    memcpy(frame + 4, answer, body - 2);
    memcpy(frame + 4 + body - 2, "]}", 2);
    size_t total = 4 + body, sent = 0;
    while (sent < total) {
        ssize_t n = write(fd, frame + sent, total - sent);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) { /* loopback buffers are large; a full one is not the floor */
                fprintf(stderr, "responder: a connection's send buffer filled\n");
                exit(1);
            }
            return; /* the peer left */
        }
        sent += (size_t)n;
    }
}

static void arm(int timer) {
    struct itimerspec at = {0};
    if (queue_size)
        at.it_value = queue[queue_head].due;
    if (timerfd_settime(timer, TFD_TIMER_ABSTIME, &at, NULL) != 0)
        die("timerfd_settime");
}

static int before_or_at(const struct timespec *a, const struct timespec *b) {
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec <= b->tv_nsec);
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: responder HOLD_US [UNIX_PATH]\n");
        return 2;
    }
    long hold_us = atol(argv[1]);
    size_t result = sizeof RESULT - 1;
    answer = malloc(12 + MAX_CALLS * (result + 1));
    if (!answer)
        die("malloc");
    memcpy(answer, "{\"results\":[", 12);
    for (size_t i = 0; i < MAX_CALLS; i++) {
        memcpy(answer + 12 + i * (result + 1), RESULT, result);
        answer[12 + i * (result + 1) + result] = ',';
    }
    bool unix_socket = argc == 3;
    int listener = socket(unix_socket ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_un local = {.sun_family = AF_UNIX};
    socklen_t length = sizeof address;
    if (unix_socket) {
        if (strlen(argv[2]) >= sizeof local.sun_path) {
            errno = ENAMETOOLONG;
            die(argv[2]);
        }
        strcpy(local.sun_path, argv[2]);
        if (listener < 0 || bind(listener, (struct sockaddr *)&local, sizeof local) != 0 ||
            listen(listener, 256) != 0)
            die(argv[2]);
    } else if (listener < 0 || bind(listener, (struct sockaddr *)&address, sizeof address) != 0 ||
               listen(listener, 64) != 0 ||
               getsockname(listener, (struct sockaddr *)&address, &length) != 0) {
        die("listen on 127.0.0.1");
    }
    printf("{\"port\": %u}\n", unix_socket ? 0u : (unsigned)ntohs(address.sin_port));
    fflush(stdout);
    int poll = epoll_create1(EPOLL_CLOEXEC);
    int timer = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (poll < 0 || timer < 0)
        die("epoll or timerfd");
    struct epoll_event event = {.events = EPOLLIN, .data.fd = listener};
    if (epoll_ctl(poll, EPOLL_CTL_ADD, listener, &event) != 0)
        die("epoll_ctl");
    event.data.fd = timer;
    if (epoll_ctl(poll, EPOLL_CTL_ADD, timer, &event) != 0)
        die("epoll_ctl");
    event.data.fd = 0; /* standard input: end of file ends the run */
    if (epoll_ctl(poll, EPOLL_CTL_ADD, 0, &event) != 0)
        die("epoll_ctl stdin");
    for (;;) {
        struct epoll_event ready[64];
        int count = epoll_wait(poll, ready, 64, -1);
        if (count < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        for (int i = 0; i < count; i++) {
            int fd = ready[i].data.fd;
            if (fd == 0) {
                char sink[64];
                if (read(0, sink, sizeof sink) <= 0)
                    return 0;
            } else if (fd == listener) {
                int client = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
                if (client < 0)
                    die("accept");
                if (client >= MAX_CONNECTIONS) {
                    errno = EMFILE;
                    die("too many connections");
                }
                int one = 1;
                if (!unix_socket)
                    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                connections[client] = (connection){.fd = client};
                event.data.fd = client;
                if (epoll_ctl(poll, EPOLL_CTL_ADD, client, &event) != 0)
                    die("epoll_ctl client");
            } else if (fd == timer) {
                uint64_t expirations;
                if (read(timer, &expirations, sizeof expirations) < 0 && errno != EAGAIN)
                    die("read timerfd");
                struct timespec now;
                clock_gettime(CLOCK_MONOTONIC, &now);
                while (queue_size && before_or_at(&queue[queue_head].due, &now)) {
                    send_answer(queue[queue_head].fd, queue[queue_head].calls);
                    queue_head = (queue_head + 1) % MAX_PENDING;
                    queue_size--;
                }
                arm(timer);
            } else {
                connection *c = &connections[fd];
                if (c->capacity - c->have < 65536) {
                    c->capacity = c->capacity ? c->capacity * 2 : 1 << 17;
                    c->in = realloc(c->in, c->capacity);
                    if (!c->in)
                        die("realloc");
                }
                ssize_t n = read(fd, c->in + c->have, c->capacity - c->have);
                if (n <= 0) {
                    if (n < 0 && errno == EINTR)
                        continue;
                    close(fd);
                    free(c->in);
                    *c = (connection){0};
                    continue;
                }
                c->have += (size_t)n;
                size_t at = 0;
                while (c->have - at >= 8) {
                    uint32_t body = get32(c->in + at), calls = get32(c->in + at + 4);
                    if (c->have - at < 8 + (size_t)body)
                        break;
                    if (calls == 0 || calls > MAX_CALLS) {
                        errno = EINVAL;
                        die("a batch of 0 or too many calls");
                    }
                    at += 8 + body;
                    if (hold_us <= 0) {
                        send_answer(fd, calls);
                        continue;
                    }
                    if (queue_size == MAX_PENDING) {
                        errno = ENOBUFS;
                        die("too many held answers");
                    }
                    pending *p = &queue[(queue_head + queue_size) % MAX_PENDING];
                    clock_gettime(CLOCK_MONOTONIC, &p->due);
                    p->due.tv_nsec += (hold_us % 1000000) * 1000;
                    p->due.tv_sec += hold_us / 1000000 + p->due.tv_nsec / 1000000000;
                    p->due.tv_nsec %= 1000000000;
                    p->fd = fd;
                    p->calls = calls;
                    if (queue_size++ == 0)
                        arm(timer);
                }
                memmove(c->in, c->in + at, c->have - at);
                c->have -= at;
            }
        }
    }
}
