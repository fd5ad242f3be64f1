"""The data plane of the weight broadcast, shared by the learner (sender) and the servers'
engines (receivers): ``collective`` (a torch.distributed process group over gloo or NCCL, and
bucketed broadcasts) and ``cuda_ipc`` (a learner and a server on one GPU exchange CUDA IPC
handles instead)."""
