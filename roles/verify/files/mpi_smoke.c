/*
 * MPI smoke test across hosts (roles/verify/tasks/mpi_smoke.yml).
 *
 * Every rank sums the rank numbers with MPI_Allreduce and describes where it runs: host name and
 * IPv4 addresses, so the caller can tell which hostfile entries answered. Rank 0 gathers those
 * descriptions and prints them as one JSON line, so output from different hosts never interleaves:
 *
 *   MPI_SMOKE_JSON {"size":3,"expected":3,"ranks":[{"rank":0,"sum":3,"host":"gpu01","addrs":["10.0.0.1"]},...]}
 *
 * Exit status 0 only when every rank received the right sum.
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define INFO_LEN 1024

/* "a","b": the IPv4 addresses of every interface but loopback, as JSON strings. */
static void ipv4_addresses(char *out, size_t len)
{
    struct ifaddrs *list = NULL;
    size_t used = 0;

    out[0] = '\0';
    if (getifaddrs(&list) != 0)
        return;
    for (struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
        char addr[INET_ADDRSTRLEN];
        const struct sockaddr_in *in;

        if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != AF_INET)
            continue;
        in = (const struct sockaddr_in *)ifa->ifa_addr;
        if (inet_ntop(AF_INET, &in->sin_addr, addr, sizeof addr) == NULL || strncmp(addr, "127.", 4) == 0)
            continue;
        int n = snprintf(out + used, len - used, "%s\"%s\"", used ? "," : "", addr);
        if (n < 0 || (size_t)n >= len - used)
            break;
        used += (size_t)n;
    }
    freeifaddrs(list);
}

int main(int argc, char **argv)
{
    int rank = 0, size = 0;
    long long mine, sum = 0, expected;
    char host[256] = "", addrs[INFO_LEN / 2], info[INFO_LEN];
    char *all = NULL;
    int wrong = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    mine = rank;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    expected = (long long)size * (size - 1) / 2;

    gethostname(host, sizeof host - 1);
    ipv4_addresses(addrs, sizeof addrs);
    memset(info, 0, sizeof info);
    /* Host names are letters, digits, '-' and '.': nothing to escape in JSON. */
    snprintf(info, sizeof info, "{\"rank\":%d,\"sum\":%lld,\"host\":\"%s\",\"addrs\":[%s]}", rank, sum, host,
             addrs);

    if (rank == 0) {
        all = calloc((size_t)size, INFO_LEN);
        if (all == NULL) {
            fprintf(stderr, "mpi_smoke: out of memory for %d ranks\n", size);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    MPI_Gather(info, INFO_LEN, MPI_CHAR, all, INFO_LEN, MPI_CHAR, 0, MPI_COMM_WORLD);

    /* Every rank's verdict, so a rank that got a wrong sum fails the job. */
    int bad = sum != expected;
    MPI_Reduce(&bad, &wrong, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);

    if (rank == 0) {
        printf("MPI_SMOKE_JSON {\"size\":%d,\"expected\":%lld,\"ranks\":[", size, expected);
        for (int i = 0; i < size; i++)
            printf("%s%s", i ? "," : "", all + (size_t)i * INFO_LEN);
        printf("]}\n");
        fflush(stdout);
        free(all);
    }
    MPI_Finalize();
    return (rank == 0 && wrong != 0) ? 1 : 0;
}
