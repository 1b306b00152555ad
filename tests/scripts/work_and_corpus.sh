# Sourced by the test scripts called as `SCRIPT GTRAIN GTRAIN_PREP "MPIEXEC;FLAGS..." WORKDIR`: sets
# gtrain, prep, work and the mpi array (the launcher and its flags), makes WORKDIR afresh, enters it and
# writes a byte corpus there (corpus.train.bin, corpus.val.bin) from the system's license texts.
gtrain=$1 prep=$2 work=$4
IFS=';' read -ra mpi <<<"$3"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$prep" -o corpus /usr/share/common-licenses/* >/dev/null
