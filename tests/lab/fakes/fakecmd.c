/* The client of a faked command in a lab host (see server.py for the design and the protocol).
 *
 * Installed as the interpreter of each faked command's wrapper: /usr/bin/NAME is the two-line text
 *     #!/LAB/fakes/fakecmd NAME
 * so the kernel runs `fakecmd NAME /usr/bin/NAME ARGS...`. The client hands NAME, ARGS, its environment,
 * umask, groups, working directory and stdin/stdout/stderr to the lab's fake server (LAB/fake.sock next
 * to this binary's directory), waits for the command's wait status and ends with it. It forwards the
 * signals a command usually gets (TERM, INT, HUP, QUIT, ALRM, USR1, USR2) to the process that runs the
 * fake. If the server cannot be reached, it runs `/usr/bin/python3 LAB/fakes/fake.py NAME ARGS` itself,
 * which is what the wrapper did before the server existed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static volatile sig_atomic_t child_pid = 0;
static volatile sig_atomic_t pending[65];

static void forward(int sig) {
    if (child_pid > 0) kill((pid_t)child_pid, sig);
    else pending[sig] = 1;
}

static int read_full(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* A command the server answered itself: its exit status, then its writes (fd, length, bytes) in order. */
static int replay(int s, const char *name) {
    int32_t status;
    if (read_full(s, &status, 4) != 0) {
        fprintf(stderr, "%s: the lab's fake server went away\n", name);
        return 127;
    }
    signal(SIGPIPE, SIG_IGN); /* as in the Python process that made these writes */
    int broken = 0;
    static char buf[65536];
    for (;;) {
        unsigned char hdr[5];
        uint32_t n;
        if (read_full(s, hdr, 5) != 0) {
            fprintf(stderr, "%s: the lab's fake server went away\n", name);
            return 127;
        }
        memcpy(&n, hdr + 1, 4);
        if (hdr[0] == 255) break;
        while (n) {
            size_t k = n < sizeof buf ? n : sizeof buf;
            if (read_full(s, buf, k) != 0) return 127;
            n -= (uint32_t)k;
            for (size_t off = 0; off < k && !(broken & (1 << hdr[0]));) {
                ssize_t w = write(hdr[0], buf + off, k - off);
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) {
                    broken |= 1 << hdr[0];
                    break;
                }
                off += (size_t)w;
            }
        }
    }
    if (broken & 2) { /* what Python says when stdout's reader went away */
        static const char msg[] = "Exception ignored in: <_io.TextIOWrapper name='<stdout>' mode='w' "
                                  "encoding='utf-8'>\nBrokenPipeError: [Errno 32] Broken pipe\n";
        if (write(2, msg, sizeof msg - 1) < 0) { /* nothing left to tell */ }
        return 120;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

static void fallback(const char *dir, const char *name, int argc, char **argv) {
    char fake[PATH_MAX + 16];
    snprintf(fake, sizeof fake, "%s/fake.py", dir);
    char **a = calloc((size_t)argc + 4, sizeof *a);
    if (!a) _exit(127);
    int n = 0;
    a[n++] = "/usr/bin/python3";
    a[n++] = fake;
    a[n++] = (char *)name;
    for (int i = 0; i < argc; i++) a[n++] = argv[i];
    a[n] = NULL;
    signal(SIGPIPE, SIG_DFL);
    execv(a[0], a);
    fprintf(stderr, "%s: cannot run the lab's fake: %s\n", name, strerror(errno));
    _exit(127);
}

int main(int argc, char **argv) {
    /* argv, as the kernel makes it from the wrapper's first line: fakecmd NAME WRAPPER-PATH ARGS... */
    if (argc < 3) {
        fprintf(stderr, "usage: '#!fakecmd NAME' as the first line of a faked command\n");
        return 2;
    }
    const char *name = argv[1];
    int nargs = argc - 3;
    char **args = argv + 3;

    char dir[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", dir, sizeof dir - 1);
    if (len <= 0) return 127;
    dir[len] = 0;
    char *slash = strrchr(dir, '/');
    if (!slash) return 127;
    *slash = 0; /* dir = LAB/fakes */
    char sock_path[PATH_MAX + 16];
    snprintf(sock_path, sizeof sock_path, "%s", dir);
    slash = strrchr(sock_path, '/');
    strcpy(slash ? slash + 1 : sock_path, "fake.sock"); /* LAB/fake.sock */

    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (s < 0 || strlen(sock_path) >= sizeof sa.sun_path) fallback(dir, name, nargs, args);
    strcpy(sa.sun_path, sock_path);
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(s);
        fallback(dir, name, nargs, args);
    }

    /* the request */
    mode_t um = umask(0);
    umask(um);
    int ngroups = getgroups(0, NULL);
    if (ngroups < 0) ngroups = 0;
    gid_t *groups = calloc((size_t)ngroups + 1, sizeof *groups);
    if (ngroups) ngroups = getgroups(ngroups, groups);
    if (ngroups < 0) ngroups = 0;
    int envc = 0;
    size_t strbytes = strlen(name) + 1;
    for (int i = 0; i < nargs; i++) strbytes += strlen(args[i]) + 1;
    for (char **e = environ; e && *e; e++, envc++) strbytes += strlen(*e) + 1;
    size_t body = 5 * 4 + (size_t)ngroups * 4 + strbytes;
    char *msg = malloc(8 + body);
    if (!msg) return 127;
    memcpy(msg, "GK8F", 4);
    uint32_t u = (uint32_t)body;
    memcpy(msg + 4, &u, 4);
    char *p = msg + 8;

    int fds[4];
    int nfds = 0;
    int cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cwd < 0) cwd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    fds[nfds++] = cwd;
    uint32_t mask = 0;
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) != -1) {
            mask |= 1u << fd;
            fds[nfds++] = fd;
        }
    uint32_t fixed[5] = {mask, (uint32_t)um, (uint32_t)ngroups, (uint32_t)nargs + 1, (uint32_t)envc};
    memcpy(p, fixed, sizeof fixed);
    p += sizeof fixed;
    for (int i = 0; i < ngroups; i++) {
        uint32_t g = (uint32_t)groups[i];
        memcpy(p, &g, 4);
        p += 4;
    }
    size_t l = strlen(name) + 1;
    memcpy(p, name, l);
    p += l;
    for (int i = 0; i < nargs; i++) {
        l = strlen(args[i]) + 1;
        memcpy(p, args[i], l);
        p += l;
    }
    for (char **e = environ; e && *e; e++) {
        l = strlen(*e) + 1;
        memcpy(p, *e, l);
        p += l;
    }

    /* signals: forwarded to the fake's process once it exists */
    struct sigaction act = {.sa_handler = forward};
    sigemptyset(&act.sa_mask);
    int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &act, NULL);

    char cbuf[CMSG_SPACE(sizeof fds)];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec iov = {.iov_base = msg, .iov_len = 8};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                        .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
    ssize_t sent;
    do sent = sendmsg(s, &mh, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    if (sent != 8) {
        close(s);
        fallback(dir, name, nargs, args);
    }
    size_t off = 8;
    while (off < 8 + body) {
        ssize_t w = send(s, msg + off, 8 + body - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            fprintf(stderr, "%s: the lab's fake server went away\n", name);
            return 127;
        }
        off += (size_t)w;
    }
    close(cwd);

    int32_t pid, status;
    if (read_full(s, &pid, 4) != 0) {
        fprintf(stderr, "%s: the lab's fake server went away\n", name);
        return 127;
    }
    if (pid == 0) return replay(s, name); /* answered by the server itself: make its writes */
    child_pid = pid;
    for (int sig = 1; sig < 65; sig++)
        if (pending[sig]) kill(pid, sig);
    if (read_full(s, &status, 4) != 0) {
        fprintf(stderr, "%s: the lab's fake server went away\n", name);
        return 127;
    }
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        signal(sig, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        raise(sig);
        return 128 + sig;
    }
    return 1;
}
