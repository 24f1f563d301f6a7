# Sourced by the *_netns_check.sh scripts: `netns_pair A B ADDR_A ADDR_B` makes network
# namespaces A and B joined by a veth pair (eth0 on both sides, ADDR_A/24 and ADDR_B/24),
# with lo and eth0 up. Needs root and iproute2; the caller removes the namespaces.
netns_pair() {
    local a=$1 b=$2 addr_a=$3 addr_b=$4 n
    ip netns add "$a"
    ip netns add "$b"
    ip -n "$a" link add eth0 type veth peer name eth0 netns "$b"
    ip -n "$a" addr add "$addr_a/24" dev eth0
    ip -n "$b" addr add "$addr_b/24" dev eth0
    for n in "$a" "$b"; do
        ip -n "$n" link set lo up
        ip -n "$n" link set eth0 up
    done
}
