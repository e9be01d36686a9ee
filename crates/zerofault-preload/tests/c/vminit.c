/* The /init of the test VMs (crates/zerofault-cli/tests/vm.rs), linked static: mounts proc,
 * sysfs and devtmpfs, prints the online NUMA nodes ("VMTEST nodes=0-1"), runs the command
 * listed in /args (one argument per line), prints "VMTEST rc=N" on the console, and powers the
 * VM off. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    mount("proc", "/proc", "proc", 0, NULL);
    mount("sysfs", "/sys", "sysfs", 0, NULL);
    mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
    char nodes[256] = "?";
    FILE *o = fopen("/sys/devices/system/node/online", "r");
    if (o) {
        if (!fgets(nodes, sizeof nodes, o))
            strcpy(nodes, "?");
        fclose(o);
    }
    nodes[strcspn(nodes, "\n")] = 0;
    printf("VMTEST nodes=%s\n", nodes);
    static char buf[4096];
    char *argv[64];
    int n = 0;
    FILE *f = fopen("/args", "r");
    size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[len] = 0;
    for (char *s = strtok(buf, "\n"); s && n < 63; s = strtok(NULL, "\n"))
        argv[n++] = s;
    argv[n] = NULL;
    if (n == 0) {
        printf("VMTEST rc=126 (no command in /args)\n");
    } else {
        fflush(stdout);
        pid_t p = fork();
        if (p == 0) {
            execv(argv[0], argv);
            perror("execv");
            _exit(127);
        }
        int st = 0;
        waitpid(p, &st, 0);
        printf("VMTEST rc=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    }
    fflush(stdout);
    sync();
    reboot(RB_POWER_OFF);
    return 0;
}
