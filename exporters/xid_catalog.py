"""What to do about an XID, per code: the action the XID alerts carry and who hears of it.

Source: NVIDIA's XID catalog, "XID Errors" (docs.nvidia.com/deploy/xid-errors), whose table
gives each code a resolution ("immediate action": RESTART_APP, RESET_GPU, RESTART_BM,
IGNORE, and workflows for ECC and NVLink errors). Those resolutions map onto the actions
below; where the catalog says RESTART_APP for a fault of the application's own making (an
illegal address, a kernel exception), the action is ``check_app``: restarting it alone
brings the same fault back. A code missing here is alerted on as ``look_up``: a ticket that
names it, so a new driver's new XID is never silent.

Severity follows the action, as data: the GPU or node must be taken out of service → page;
the application or a maintenance window must act → ticket; nothing to do (an XID that only
follows another one, which has its own alert) → info, routed to nobody.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class XidAction:
    name: str  # the alert's `action` label
    severity: Literal["critical", "warning", "info"]
    title: str  # the alert's summary says it
    todo: str  # what the on-call does: the end of the alert's description


ACTIONS = {a.name: a for a in (
    XidAction("reboot_node", "critical", "drain and reboot the node",
              "drain the node and reboot it: the GPU is off the bus or its driver state is lost, and only a "
              "reboot (a power cycle if it does not come back) recovers it"),
    XidAction("reset_gpu", "critical", "reset the GPU",
              "drain the GPU's work and reset it (nvidia-smi --gpu-reset, or reboot the node); if the XID returns "
              "after the reset, the GPU needs service (RMA)"),
    XidAction("reset_gpu_at_maintenance", "warning", "reset the GPU at maintenance",
              "reset the GPU at its next maintenance window: a memory row remap or page retirement waits for a "
              "reset, and the GPU serves meanwhile"),
    XidAction("restart_app", "warning", "restart the application",
              "restart the application that hit it (vLLM): the fault ended its GPU context, the GPU itself is "
              "fine"),
    XidAction("check_app", "warning", "check the application",
              "check the application: the fault comes from its code or its input (an illegal memory access, a "
              "kernel exception), the GPU is fine; a restart alone brings it back"),
    XidAction("none", "info", "no action",
              "nothing: this XID follows another one (which has its own alert) when the driver cleans up"),
)}

LOOK_UP = XidAction("look_up", "warning", "look it up",
                    "look the code up in NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors): inferwatch's table "
                    "does not list it")

# XID code -> action name, after the catalog's resolution column
XID_ACTIONS: dict[int, str] = {
    13: "check_app",  # graphics engine exception: a kernel fault (out-of-range access, illegal instruction)
    31: "check_app",  # GPU memory page fault: an illegal address, almost always the application's
    43: "check_app",  # GPU stopped processing: the application's own fault ended its channel
    45: "none",  # preemptive cleanup after another error or a killed process
    48: "reset_gpu",  # double-bit ECC error
    61: "reset_gpu",  # internal micro-controller breakpoint/warning
    62: "reset_gpu",  # internal micro-controller halt
    63: "reset_gpu_at_maintenance",  # ECC page retirement or row remap recorded
    64: "reset_gpu",  # ECC page retirement or row remap failed
    74: "reset_gpu",  # NVLink error
    79: "reboot_node",  # GPU has fallen off the bus
    92: "reset_gpu_at_maintenance",  # high single-bit ECC error rate
    94: "restart_app",  # contained ECC error: only the applications that used the memory are ended
    95: "reset_gpu",  # uncontained ECC error
    109: "restart_app",  # context switch timeout
    119: "reset_gpu",  # GSP RPC timeout
    120: "reset_gpu",  # GSP error
}


def action_of(xid: int) -> XidAction:
    return ACTIONS[XID_ACTIONS[xid]] if xid in XID_ACTIONS else LOOK_UP


def codes_of(action: str) -> tuple[int, ...]:
    return tuple(sorted(code for code, name in XID_ACTIONS.items() if name == action))
