#!/usr/bin/env bash
# cluster.sh — a Slurm cluster of N nodes on one machine, for multi-node tests and by hand.
#
#   eval "$(bash tests/cluster/cluster.sh up N)"    start N nodes; prints the export lines
#   ... up N --link RATE                            the same, every node's link shaped to RATE (below)
#   bash tests/cluster/cluster.sh down              stop everything it started, remove what it made
#   bash tests/cluster/cluster.sh status            sinfo of the cluster, or "down"
#   bash tests/cluster/cluster.sh kill-node I       SIGKILL every process of node I (slurmd included)
#   bash tests/cluster/cluster.sh start-node I      start node I's slurmd again (after kill-node)
#
# Each node is a network namespace (`ip netns add gtc-nodeI`) joined to a bridge by a veth pair, with
# its own address 10.77.0.(11+I) and, through a UTS and a mount namespace of its slurmd, its own host
# name gtc-nI, its own /tmp (Slurm's PMIx plugin makes per-step directories under /tmp whose names
# would collide between nodes that share it) and its own /dev/shm (each an empty tmpfs of the node's
# mount namespace, gone when the node's last process ends: what gtrain's memory snapshots and Open
# MPI leave in a node's shared memory goes with the node, as on a real one). The bridge and slurmctld live in one more namespace,
# gtc-ctl (10.77.0.1, host name gtc-ctl, the name its SlurmctldHost gives). Every address and link is
# inside a namespace this script creates: the machine's own network is not touched, and nothing
# outside the machine is reached. The nodes share the machine's file system, as a cluster shares its
# parallel file system; munged (one, root namespace) is reached through its socket file.
#
# slurmd is entered with `nsenter --net` into its namespace, not `ip netns exec`, which remounts /sys
# and hides the cgroup file system from slurmd. The printed exports put wrappers for sbatch, srun,
# squeue, sinfo, scontrol and scancel first on PATH: from the machine's own network namespace they run
# the real command inside gtc-ctl (the only place slurmctld can be reached); inside a job (already in
# a node's namespace) they run it directly. They also set SLURM_CONF and Open MPI's TCP interface
# choice (10.77.0.0/24), so that ranks on different nodes talk over the bridge.
#
# Files (config, logs, munge key and socket, spool) live in $GTRAIN_CLUSTER_DIR (default
# /var/tmp/gtrain-cluster; not under /tmp, which each node replaces with its own). `down` stops, by
# process id, the daemons it recorded and every process left inside the namespaces it made (job
# steps), then deletes the namespaces, which takes their links and addresses with them; it works
# after a failed `up` and when nothing is up. `up` while a cluster is up takes it down first.
# `--link RATE` shapes every node's link like a cluster's network: a token-bucket filter on the
# namespace's side of its veth (`tc qdisc add dev eth0 root tbf rate RATE burst 64kb latency 50ms`), so
# what a node sends leaves at RATE at most (RATE in tc's units: 200mbit, 1gbit, 25mbps...; no added
# latency: this kernel has no netem). bench/link_rate.py derives the RATE that gives a run the
# communication-to-compute ratio of a real configuration. The filter goes with the namespace at `down`.
# `status` shows each node's qdisc.
# GTRAIN_CLUSTER_SLURMD_TIMEOUT sets SlurmdTimeout (default 300 s, Slurm's): how long a silent node
# stays "not responding" before Slurm marks it DOWN and ends its jobs (NODE_FAIL).
# GTRAIN_CLUSTER_CRED_EXPIRE sets AuthInfo's cred_expire (seconds, at least 5; default Slurm's 120):
# a job step credential's lifetime, and how long a requeued job waits before it may start again.
# Needs root, iproute2, util-linux (nsenter, unshare), munge and slurm-wlm (tools/setup-debian.sh
# --slurm; `--link` also tc). Exit 77 when one of them is missing, 1 when the cluster does not come
# up, 2 on bad arguments.
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/../slurm/daemons.sh" # start_munged, slurm_conf_common

dir=${GTRAIN_CLUSTER_DIR:-/var/tmp/gtrain-cluster}
prefix=gtc
subnet=10.77.0
ctl_ns=$prefix-ctl

note() { echo "cluster.sh: $*" >&2; }

node_ns() { echo "$prefix-node$1"; }
node_name() { echo "$prefix-n$1"; }
node_addr() { echo "$subnet.$((11 + $1))"; }

# ---------------------------------------------------------------- down
# stop_pids PID...: SIGTERM to each, up to 5 s for all of them to end, then SIGKILL to those left
stop_pids() {
  local pid left
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 1 25); do
    left=""
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && left+=" $pid"; done
    [[ -z "$left" ]] && return 0
    sleep 0.2
  done
  for pid in $left; do kill -KILL "$pid" 2>/dev/null; done
  return 0
}

down() {
  local n=0 i ns pid
  [[ -f "$dir/nodes" ]] && n=$(cat "$dir/nodes")
  # jobs first, while slurmctld is there to end them
  if [[ -f "$dir/slurm.conf" && -e /run/netns/$ctl_ns ]]; then
    SLURM_CONF=$dir/slurm.conf timeout 10 nsenter --net=/run/netns/$ctl_ns scancel --quiet --user=root \
      >/dev/null 2>&1 || true
  fi
  # the recorded daemons: every slurmd and slurmctld at once, then munged (recorded first), which
  # they may still ask while they end; each gets 5 s after SIGTERM, then SIGKILL
  if [[ -f "$dir/pids" ]]; then
    stop_pids $(tail -n +2 "$dir/pids")
    stop_pids $(head -n 1 "$dir/pids")
    rm -f "$dir/pids"
  fi
  # whatever else still runs inside our namespaces (slurmstepd, ranks of a killed job), by pid, in
  # all of them at once
  local spaces
  spaces=$(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-")
  ns_pids() { for ns in $spaces; do ip netns pids "$ns" 2>/dev/null; done; }
  for sig in TERM KILL; do
    pids=$(ns_pids)
    [[ -z "$pids" ]] && break
    for pid in $pids; do kill -"$sig" "$pid" 2>/dev/null; done
    for _ in $(seq 1 25); do [[ -z "$(ns_pids)" ]] && break; sleep 0.2; done
  done
  for ns in $spaces; do ip netns del "$ns" 2>/dev/null || note "could not delete network namespace $ns"; done
  rm -f "$dir/nodes" "$dir/env"
  return 0
}

# ---------------------------------------------------------------- up
need() {
  (($(id -u) == 0)) || { note "needs root (network namespaces, slurmd)"; exit 77; }
  local c
  for c in ip nsenter unshare munged munge slurmctld slurmd sinfo; do
    command -v "$c" >/dev/null 2>&1 || { note "$c not found (tools/setup-debian.sh --slurm)"; exit 77; }
  done
}

fail_up() {
  note "$*"
  local f
  for f in "$dir"/slurmctld.log "$dir"/slurmd-*.log "$dir"/*.stdout "$dir"/munged.log; do
    [[ -s "$f" ]] && { echo "----- $f (last 15 lines)" >&2; tail -n 15 "$f" >&2; }
  done
  down
  exit 1
}

# start_slurmd I: node I's slurmd in its network namespace, with its host name, its own /tmp and
# /dev/shm (each an empty tmpfs) and the cluster's /etc/hosts (a fresh UTS and mount namespace each
# time: they end with their processes, and the two file systems with them)
start_slurmd() {
  SLURM_CONF=$dir/slurm.conf nsenter --net=/run/netns/"$(node_ns $1)" unshare --uts --mount --propagation private \
    sh -c 'hostname "$0"; mount -t tmpfs -o mode=1777 tmpfs /tmp && mount -t tmpfs -o mode=1777 tmpfs /dev/shm &&
           mount --bind "$1" /etc/hosts &&
           exec slurmd -D -N "$0"' "$(node_name $1)" "$dir/hosts" >>"$dir/slurmd-$(node_name $1).stdout" 2>&1 &
  echo $! >>"$dir/pids"
}

up() {
  local n=$1 link=${2:-} i cpus
  [[ "$n" =~ ^[1-9][0-9]?$ ]] || { note "up N: N from 1 to 99"; exit 2; }
  if [[ -n "$link" ]]; then
    [[ "$link" =~ ^[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)$ ]] ||
      { note "up N --link RATE: RATE '$link' is not a rate (expected a number and bit, kbit, mbit, gbit, bps, kbps, mbps or gbps: 200mbit)"; exit 2; }
    command -v tc >/dev/null 2>&1 || { note "tc not found (iproute2): --link needs it"; exit 77; }
  fi
  [[ -z "${GTRAIN_CLUSTER_CRED_EXPIRE:-}" || ( "$GTRAIN_CLUSTER_CRED_EXPIRE" =~ ^[0-9]+$ && $GTRAIN_CLUSTER_CRED_EXPIRE -ge 5 ) ]] ||
    { note "GTRAIN_CLUSTER_CRED_EXPIRE=$GTRAIN_CLUSTER_CRED_EXPIRE: expected whole seconds, at least 5 (Slurm's minimum)"; exit 2; }
  need
  down
  rm -rf "$dir/state" "$dir/spool" # no job of an earlier cluster comes back with the new one
  mkdir -p "$dir/bin" "$dir/state"
  chmod 755 "$dir"
  rm -f "$dir"/*.log "$dir"/*.stdout
  echo "$n" >"$dir/nodes"
  cpus=$(nproc)

  # the network: the bridge in gtc-ctl, one veth pair per node created straight into the namespaces
  ip netns add "$ctl_ns" || fail_up "ip netns add $ctl_ns failed"
  ip -n "$ctl_ns" link set lo up
  ip -n "$ctl_ns" link add br0 type bridge || fail_up "no bridge in $ctl_ns"
  ip -n "$ctl_ns" addr add "$subnet.1/24" dev br0
  ip -n "$ctl_ns" link set br0 up
  {
    echo "127.0.0.1 localhost"
    echo "$subnet.1 $prefix-ctl"
  } >"$dir/hosts"
  for ((i = 0; i < n; i++)); do
    local ns
    ns=$(node_ns $i)
    ip netns add "$ns" || fail_up "ip netns add $ns failed"
    mkdir -p "$dir/spool/$(node_name $i)"
    ip -n "$ns" link set lo up
    ip link add "v$i" netns "$ctl_ns" type veth peer name eth0 netns "$ns" || fail_up "no veth for $ns"
    ip -n "$ctl_ns" link set "v$i" master br0 up
    ip -n "$ns" addr add "$(node_addr $i)/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [[ -n "$link" ]]; then
      tc -n "$ns" qdisc add dev eth0 root tbf rate "$link" burst 64kb latency 50ms ||
        fail_up "tc could not shape $ns's link to $link"
    fi
    echo "$(node_addr $i) $(node_name $i)" >>"$dir/hosts"
  done
  if [[ -n "$link" ]]; then echo "$link" >"$dir/link"; else rm -f "$dir/link"; fi

  # munge, with a key and socket of its own
  start_munged "$dir"
  local munge_rc=$?
  echo "$munged_pid" >>"$dir/pids"
  ((munge_rc == 0)) || fail_up "munged does not answer on $dir/munge.socket"

  {
    cat <<EOF
# tests/cluster/cluster.sh: $n nodes, each a network namespace on a bridge
ClusterName=gtraincluster
SlurmctldHost=$prefix-ctl($subnet.1)
SlurmctldPort=6817
SlurmdPort=6818
KillWait=10
SlurmdTimeout=${GTRAIN_CLUSTER_SLURMD_TIMEOUT:-300}
EOF
    slurm_conf_common "$dir" | sed "s|^AuthInfo=.*|&${GTRAIN_CLUSTER_CRED_EXPIRE:+,cred_expire=$GTRAIN_CLUSTER_CRED_EXPIRE}|"
    for ((i = 0; i < n; i++)); do
      echo "NodeName=$(node_name $i) NodeAddr=$(node_addr $i) CPUs=$cpus RealMemory=500 State=UNKNOWN"
    done
    echo "PartitionName=test Nodes=$prefix-n[0-$((n - 1))] Default=YES MaxTime=INFINITE State=UP"
  } >"$dir/slurm.conf"
  export SLURM_CONF=$dir/slurm.conf

  # slurmctld under the host name SlurmctldHost gives, in gtc-ctl
  nsenter --net=/run/netns/$ctl_ns unshare --uts --mount --propagation private \
    sh -c 'hostname "$0"; mount --bind "$1" /etc/hosts; exec slurmctld -D -i' "$prefix-ctl" "$dir/hosts" \
    >"$dir/slurmctld.stdout" 2>&1 &
  echo $! >>"$dir/pids"
  for ((i = 0; i < n; i++)); do start_slurmd $i; done

  # wrappers: the Slurm commands, run inside gtc-ctl from the machine's own network namespace
  local c real
  for c in sbatch srun squeue sinfo scontrol scancel salloc sacct; do
    real=$(PATH=/usr/local/bin:/usr/bin:/bin command -v $c || echo /usr/bin/$c) # never a wrapper
    cat >"$dir/bin/$c" <<EOF
#!/bin/sh
# tests/cluster/cluster.sh: $c against the namespace cluster
if [ "\$(readlink /proc/self/ns/net)" = "$(readlink /proc/self/ns/net)" ]; then # the namespace of \`up\`
  exec nsenter --net=/run/netns/$ctl_ns $real "\$@"
fi
exec $real "\$@"
EOF
    chmod 755 "$dir/bin/$c"
  done
  cat >"$dir/env" <<EOF
export SLURM_CONF=$dir/slurm.conf
export PATH=$dir/bin:\$PATH
export OMPI_MCA_btl_tcp_if_include=$subnet.0/24 OMPI_MCA_oob_tcp_if_include=$subnet.0/24
export OMPI_MCA_btl=self,tcp
EOF

  local idle=""
  for _ in $(seq 1 120); do
    idle=$(nsenter --net=/run/netns/$ctl_ns sinfo -h -t idle -o %D 2>/dev/null | head -n 1)
    [[ "$idle" == "$n" ]] && break
    sleep 0.5
  done
  [[ "$idle" == "$n" ]] || fail_up "the $n nodes did not come up idle within 60 s ($(nsenter --net=/run/netns/$ctl_ns sinfo -h -o '%t %D %E' 2>&1 | tr '\n' ' '))"
  note "up: $n nodes ($(nsenter --net=/run/netns/$ctl_ns sinfo -h -N -o '%N %t' | tr '\n' ' ')), ${link:+links shaped to $link, }files in $dir"
  cat "$dir/env"
}

case "${1:-}" in
  up)
    n=2 link=""
    [[ $# -ge 2 && "$2" != --* ]] && { n=$2; shift; }
    shift
    while [[ $# -gt 0 ]]; do
      case "$1" in
        --link) [[ $# -ge 2 ]] || { note "up N --link RATE: no RATE"; exit 2; }; link=$2; shift 2 ;;
        --link=*) link=${1#--link=}; shift ;;
        *) note "up: unknown argument '$1' (usage: up N [--link RATE])"; exit 2 ;;
      esac
    done
    up "$n" "$link"
    ;;
  down) need; down ;;
  kill-node)
    # a node's sudden death: SIGKILL to every process in its namespace (slurmd, slurmstepd, ranks)
    [[ "${2:-}" =~ ^[0-9]+$ && -e /run/netns/$(node_ns "${2:-x}") ]] || { note "kill-node I: no node I"; exit 2; }
    for pid in $(ip netns pids "$(node_ns "$2")"); do kill -KILL "$pid" 2>/dev/null; done
    ;;
  start-node)
    # a node back after kill-node, as after a reboot: its slurmd again (ReturnToService=2 makes a
    # DOWN node usable as soon as it registers); its network namespace and address were never removed.
    # What its killed steps left in its spool directory goes first (their sockets, PMIx's pmix.J.S
    # directories): Slurm 22.05's PMIx plugin fails a step of the same job and step id (a requeued job
    # counts its steps from 0 again) on them, "Cannot create directory ...: File exists".
    [[ "${2:-}" =~ ^[0-9]+$ && -e /run/netns/$(node_ns "${2:-x}") ]] || { note "start-node I: no node I"; exit 2; }
    [[ -z "$(ip netns pids "$(node_ns "$2")")" ]] || { note "start-node $2: node $2 still runs processes"; exit 2; }
    find "$dir/spool/$(node_name "$2")" -mindepth 1 -maxdepth 1 \( -type s -o -name 'pmix.*' \) -exec rm -rf {} +
    start_slurmd "$2"
    ;;
  status)
    if [[ -f "$dir/nodes" && -e /run/netns/$ctl_ns ]]; then
      SLURM_CONF=$dir/slurm.conf nsenter --net=/run/netns/$ctl_ns sinfo -N
      for ((i = 0; i < $(cat "$dir/nodes"); i++)); do
        echo "$(node_name $i) link: $(tc -n "$(node_ns $i)" qdisc show dev eth0 2>/dev/null | head -n 1)"
      done
    else echo down; fi
    ;;
  *) echo "usage: cluster.sh up N [--link RATE] | down | status | kill-node I | start-node I" >&2; exit 2 ;;
esac
