"""The fleet view's lost-GPU count, from condition messages alone (pure): names, totals, garbage."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from gpuwarden.controller import fleet

UUID = "GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
LOST = f"GPU-K8S-012 [GPU 3 (0000:3b:00.0) {UUID}]: GPU 3 (0000:3b:00.0) of 8 is lost … Fix: taint"


def _node(cap="8", alloc="8", message=LOST, status="True"):
    return {"metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.present": "true"}},
            "status": {"capacity": {"nvidia.com/gpu": cap}, "allocatable": {"nvidia.com/gpu": alloc},
                       "conditions": [{"type": "Ready", "status": "True"},
                                      {"type": "GPUDevicePlugin", "status": status, "reason": "GpuK8s012",
                                       "message": message}]}}


def test_gpu_3_of_8_lost_and_the_scheduler_still_counts_it():
    view = fleet.build([_node()], [], [], None, None, 0.0)
    gc = view["nodes"][0]["gpuCount"]
    assert (gc["usable"], gc["allocatable"], gc["overcounted"]) == (7, 8, True)
    text = fleet.render_text(view, 0.0)
    assert f"node gpu-a: GPU 3 of 8 lost (0000:3b:00.0 {UUID}; GPU-K8S-012)" in text
    assert "usable 7, allocatable nvidia.com/gpu 8: the scheduler still counts the lost GPU(s)" in text


def test_allocatable_already_lowered_is_not_overcounted_and_a_cleared_condition_counts_nothing():
    gc = fleet.build([_node(alloc="7")], [], [], None, None, 0.0)["nodes"][0]["gpuCount"]
    assert (gc["usable"], gc["overcounted"]) == (7, False)
    gc = fleet.build([_node(status="False")], [], [], None, None, 0.0)["nodes"][0]["gpuCount"]
    assert gc["lost"] == [] and gc["usable"] == 8
    hw_old = "GPU-HW-002 [GPU 3 (0000:3b:00.0)]: GPU 0000:3b:00.0 fell off the bus before the last reboot (…)"
    assert fleet.lost_gpus([hw_old]) == []  # back now: not lost


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.one_of(st.none(), st.text(max_size=6)))
def test_garbage_messages_and_quantities_never_raise(msg, cap):
    view = fleet.build([_node(cap=cap, alloc=cap, message=msg)], [], [], None, None, 0.0)
    fleet.render_text(view, 0.0)
