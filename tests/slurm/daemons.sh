# daemons.sh — what the two test clusters share, sourced by tests/slurm/run_slurm_test.sh (one node,
# the machine itself) and tests/cluster/cluster.sh (N nodes in network namespaces): a munged of their
# own and the slurm.conf lines that do not depend on where the daemons run. How slurmctld and slurmd
# are started, their host names, addresses and ports, and the nodes stay with each script: they are
# what differs.

# start_munged DIR: munged with its own key and socket in DIR (DIR must be searchable by all: munged
# checks the socket's directory); sets munged_pid. Returns 1 when it does not answer within 10 s.
start_munged() {
  dd if=/dev/urandom of="$1/munge.key" bs=1024 count=1 2>/dev/null
  chmod 600 "$1/munge.key"
  munged -F --force --key-file="$1/munge.key" --socket="$1/munge.socket" --pid-file="$1/munged.pid" \
    --seed-file="$1/munged.seed" >"$1/munged.log" 2>&1 &
  munged_pid=$!
  for _ in $(seq 1 50); do
    munge -S "$1/munge.socket" -n 2>/dev/null | unmunge -S "$1/munge.socket" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}

# slurm_conf_common DIR: the slurm.conf lines both clusters use, every file under DIR (slurmd's
# per node: %n). Root runs the daemons and the jobs; no cgroups or CPU binding (task/none, processes
# tracked by /proc), so the ranks run where slurmd runs; the scheduler looks every second; a job may
# requeue itself (JobRequeue) and stays visible 600 s after its end (MinJobAge), for the tests to read.
# Also writes DIR/plugstack.conf empty, so that no SPANK plugin of the machine's Slurm is loaded.
slurm_conf_common() {
  cat <<EOF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$1/munge.socket
StateSaveLocation=$1/state
SlurmdSpoolDir=$1/spool/%n
SlurmctldPidFile=$1/slurmctld.pid
SlurmdPidFile=$1/slurmd-%n.pid
SlurmctldLogFile=$1/slurmctld.log
SlurmdLogFile=$1/slurmd-%n.log
PlugStackConfig=$1/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobRequeue=1
MinJobAge=600
EOF
  : >"$1/plugstack.conf"
}
