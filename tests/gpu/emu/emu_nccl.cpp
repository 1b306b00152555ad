/*
 * emu_nccl.cpp — NCCL for gtrain_emulated (tests/gpu.cmake): not emulated. The emulation has one device
 * and one OS thread, so there is nothing for NCCL to connect; every entry src/dist/comm_nccl.c calls is
 * defined here (gtrain_emulated links no libnccl) and fails with ncclInvalidUsage, which
 * ncclGetErrorString turns into words saying so. dist.comm=nccl therefore stops at ncclGetUniqueId with
 * that message (comm_nccl.c's nccl_fail), and the trainer test runs the local communicator only.
 * ncclGetVersion answers 0 ("none"), as for a missing library, so `gtrain_emulated --version` says it.
 */
#include <nccl.h>

extern "C" {

static const char NO_NCCL[] = "no NCCL in the CPU emulation (tests/gpu/emu): dist.comm=nccl needs a GPU";

const char *ncclGetErrorString(ncclResult_t result) {
    return result == ncclSuccess ? "no error" : NO_NCCL;
}
ncclResult_t ncclGetVersion(int *version) {
    *version = 0;
    return ncclInvalidUsage;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId *) { return ncclInvalidUsage; }
ncclResult_t ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int) { return ncclInvalidUsage; }
ncclResult_t ncclCommAbort(ncclComm_t) { return ncclInvalidUsage; }
ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclInvalidUsage; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *async) {
    *async = ncclInvalidUsage;
    return ncclInvalidUsage;
}
ncclResult_t ncclGroupStart(void) { return ncclInvalidUsage; }
ncclResult_t ncclGroupEnd(void) { return ncclInvalidUsage; }
ncclResult_t ncclAllReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
ncclResult_t ncclReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
ncclResult_t ncclBroadcast(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
ncclResult_t ncclAllGather(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
ncclResult_t ncclReduceScatter(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}

} /* extern "C" */
