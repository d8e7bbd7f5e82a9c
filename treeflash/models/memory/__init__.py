"""Memory planning: what a configuration will hold on its device, computed from checkpoint headers.

No weight is read: a GGUF's tensor table and a safetensors file's JSON header give every tensor's
shape and stored type; `placement` turns those into bytes on the device, `parts` sizes the KV cache,
the recurrent state and the CUDA-graph buffers the stack allocates, and `plan.plan_memory` adds them
up into a frozen `MemoryPlan` that the CLI (`treeflash fit`, serve, generate), bench and /metrics read.
"""

from treeflash.models.memory.header import CheckpointHeader, HeaderTensor, read_header
from treeflash.models.memory.overheads import Overheads
from treeflash.models.memory.plan import DrafterShape, MemoryPlan, PlanRequest, Part, plan_memory

__all__ = ["CheckpointHeader", "HeaderTensor", "read_header", "Overheads", "DrafterShape", "MemoryPlan", "PlanRequest",
           "Part", "plan_memory"]
