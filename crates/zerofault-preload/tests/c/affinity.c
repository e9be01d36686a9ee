/* The CPUs the program allows itself, after its first large request: the engine's threads must
 * run only where the program's may. Each mode narrows the process to CPU 0, writes and frees
 * large blocks, waits a moment, and prints how many of its threads may still run elsewhere;
 * natively and under the shim the lines must be the same. The number of threads goes to
 * stderr.
 *
 *   affinity self      sched_setaffinity(0, {0}) on its only thread
 *   affinity pthread   pthread_setaffinity_np(pthread_self(), {0})
 *   affinity outside   `taskset -p 1 PID` from another process (as an operator would) */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define BIG (64 * MIB)

static void churn(int rounds) {
    for (int r = 0; r < rounds; r++) {
        unsigned char *b = malloc(BIG);
        if (!b)
            exit(90);
        memset(b, r + 1, BIG);
        __asm__ volatile("" : : "r"(b) : "memory");
        free(b);
    }
}

/* Threads of the process that may run on a CPU other than 0 (their Cpus_allowed_list is not
 * "0"); each named on stderr with its list. `all` counts every thread. */
static int outside_cpu0(int *all) {
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;
    *all = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[320], line[512], name[64] = "?", cpus[256] = "?";
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f)) {
            if (!strncmp(line, "Name:", 5))
                sscanf(line + 5, "%63s", name);
            if (!strncmp(line, "Cpus_allowed_list:", 18))
                sscanf(line + 18, "%255s", cpus);
        }
        if (f)
            fclose(f);
        ++*all;
        if (strcmp(cpus, "0")) {
            fprintf(stderr, "thread %s (%s) allowed %s\n", e->d_name, name, cpus);
            n++;
        }
    }
    if (d)
        closedir(d);
    return n;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    cpu_set_t cpu0;
    CPU_ZERO(&cpu0);
    CPU_SET(0, &cpu0);
    cpu_set_t have;
    if (sched_getaffinity(0, sizeof have, &have) || !CPU_ISSET(0, &have) || CPU_COUNT(&have) < 2) {
        printf("needs CPU 0 and another CPU allowed (has %d)\n", CPU_COUNT(&have));
        return 3;
    }
    churn(1);
    int r;
    if (!strcmp(mode, "self")) {
        r = sched_setaffinity(0, sizeof cpu0, &cpu0);
    } else if (!strcmp(mode, "pthread")) {
        r = pthread_setaffinity_np(pthread_self(), sizeof cpu0, &cpu0);
    } else if (!strcmp(mode, "outside")) {
        char pid[16];
        snprintf(pid, sizeof pid, "%d", (int)getpid());
        pid_t c = fork();
        if (c == 0) {
            freopen("/dev/null", "w", stdout); /* its line names the pid */
            execlp("taskset", "taskset", "-p", "1", pid, (char *)NULL);
            _exit(127);
        }
        int st;
        r = waitpid(c, &st, 0) == c && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    } else {
        fprintf(stderr, "usage: affinity self | pthread | outside\n");
        return 2;
    }
    printf("%s: %d\n", mode, r);
    churn(4);
    usleep(400000); /* longer than the engine's periodic look */
    churn(1);
    int all, n = outside_cpu0(&all);
    fprintf(stderr, "threads %d\n", all);
    printf("threads that may run outside CPU 0: %d\n", n);
    return 0;
}
