#!/usr/bin/env bash
# link_shaping.sh SRC WORK — cluster.sh's `--link RATE`: every node's link carries the token-bucket
# filter at RATE while the cluster is up, `status` shows it, and it goes with the cluster at `down`;
# a RATE that is not one is refused with exit 2 before anything is made. Exit 77 without root or the
# cluster's tools, and when a cluster is already up (`up` would take it down).
set -uo pipefail
src=$1 work=$2
cluster=$src/tests/cluster/cluster.sh
fail() { echo "FAIL: $*" >&2; bash "$cluster" down >/dev/null 2>&1; exit 1; }

(($(id -u) == 0)) || { echo "needs root: skipped"; exit 77; }
command -v tc >/dev/null 2>&1 || { echo "no tc: skipped"; exit 77; }
if ip netns list 2>/dev/null | grep -q '^gtc-'; then echo "a test cluster is up: skipped"; exit 77; fi

mkdir -p "$work"
# The cluster's files (slurm.conf names them, every node reads them) go where every node sees the same
# directory and no space can split a path: not under /tmp (each node has its own) nor the build's path.
GTRAIN_CLUSTER_DIR=/var/tmp/gtrain-link-shaping.$(printf '%s' "$work" | cksum | cut -d' ' -f1)
export GTRAIN_CLUSTER_DIR

bash "$cluster" up 2 --link 12parsecs >"$work/bad.out" 2>&1
rc=$?
((rc == 2)) || fail "up --link 12parsecs: exit $rc, want 2: $(cat "$work/bad.out")"
grep -q "RATE '12parsecs' is not a rate" "$work/bad.out" || fail "up --link 12parsecs said: $(cat "$work/bad.out")"
ip netns list | grep -q '^gtc-' && fail "a refused up left namespaces: $(ip netns list | tr '\n' ' ')"

bash "$cluster" up 2 --link 200mbit >"$work/up.out" 2>&1
rc=$?
((rc == 77)) && { echo "cluster prerequisites missing: skipped"; cat "$work/up.out"; exit 77; }
((rc == 0)) || { cat "$work/up.out" >&2; fail "up 2 --link 200mbit: exit $rc"; }
for i in 0 1; do
  q=$(tc -n "gtc-node$i" qdisc show dev eth0)
  [[ "$q" == *"qdisc tbf"*"rate 200Mbit"* ]] || fail "node $i's eth0 has no tbf at 200Mbit: $q"
  echo "node $i: $q"
done
bash "$cluster" status >"$work/status.out" 2>&1
grep -q "gtc-n1 link: qdisc tbf" "$work/status.out" || fail "status does not show the shaped link: $(cat "$work/status.out")"
bash "$cluster" down || fail "down failed"
ip netns list | grep -q '^gtc-' && fail "down left namespaces: $(ip netns list | tr '\n' ' ')"
tc -n gtc-node0 qdisc show dev eth0 >/dev/null 2>&1 && fail "node 0's shaped link is still there after down"

# unshaped: no tbf
bash "$cluster" up 1 >"$work/up1.out" 2>&1 || { cat "$work/up1.out" >&2; fail "up 1 failed"; }
q=$(tc -n gtc-node0 qdisc show dev eth0)
[[ "$q" != *tbf* ]] || fail "an unshaped cluster's link has a tbf: $q"
bash "$cluster" down || fail "down failed"
rm -rf "$GTRAIN_CLUSTER_DIR"
echo "ok: --link shapes every node's link, status shows it, down removes it, a bad RATE exits 2"
