"""The live views in a real Jupyter kernel, watched as a frontend watches it (the messages on IOPub).

A dashboard stays live after its cell has finished: its thread's refreshes arrive as
``update_display_data`` for the display id its output was shown with, which Jupyter applies to that
output. A launch's start-up lines are one output redrawn, not a stream of lines.
"""

from __future__ import annotations

import queue
import time

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import start_new_kernel

WAIT_S = 60.0  # for a message that a refresh every 0.1 s sends; generous for a loaded 2-core machine

DASHBOARD = """
import time
from disaggsdk.report.dashboard import Dashboard
from disaggsdk.records.instance_stats import InstanceStats
from disaggsdk.report.latency import RequestTimeline
from disaggsdk.serve.metrics import ServedRequest

served = []
stats = [InstanceStats("decode-0", "decode")]
dashboard = Dashboard(lambda: served, lambda: stats, title="demo", interval_s=0.1).start()
dashboard
"""
SERVE_ONE = """
now = time.monotonic()
served.append(ServedRequest("decode-0", RequestTimeline(now - 0.3, [now - 0.2, now - 0.1], prompt_tokens=4),
                            "length", now))
"""
STARTUP = """
from disaggsdk.report.startup_status import StartupStatus

status = StartupStatus()
for line in ["decode-0: loading weights", "decode-0: ready after 1.0 s", "ready: 1 unit", "ready in 1.2 s"]:
    status(line)
"""


@pytest.fixture(scope="module")
def kernel():
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def run_cell(client: BlockingKernelClient, code: str) -> list[dict]:
    """Execute ``code`` as a cell; its IOPub messages until the kernel is idle again."""
    messages: list[dict] = []
    reply = client.execute_interactive(code, timeout=WAIT_S, output_hook=messages.append)
    assert reply["content"]["status"] == "ok", reply["content"]
    return messages


def display_id_of(message: dict) -> str | None:
    return message["content"].get("transient", {}).get("display_id")


def test_a_dashboard_is_redrawn_after_its_cell_ended(kernel: BlockingKernelClient):
    shown = [m for m in run_cell(kernel, DASHBOARD) if m["msg_type"] == "display_data"]
    assert len(shown) == 1 and display_id_of(shown[0]) is not None  # a display with an id, no widget
    (dashboard_id,) = {display_id_of(m) for m in shown}
    assert set(shown[0]["content"]["data"]) == {"text/html", "text/plain"}
    assert "no requests yet" in shown[0]["content"]["data"]["text/html"]
    run_cell(kernel, SERVE_ONE)  # ends at once: what follows is the dashboard's thread, no cell running
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            message = kernel.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail("no redraw of the dashboard arrived after its cell ended")
        if message["msg_type"] == "update_display_data" and display_id_of(message) == dashboard_id:
            html = message["content"]["data"]["text/html"]
            if "<circle" in html:  # the request served after the cell ended is on the plot
                assert "<td>decode-0</td>" in html
                break
    run_cell(kernel, "dashboard.stop()")


def test_startup_lines_are_one_output_redrawn_not_a_stream(kernel: BlockingKernelClient):
    messages = run_cell(kernel, STARTUP)
    assert not [m for m in messages if m["msg_type"] == "stream"]
    shown = [m for m in messages if m["msg_type"] == "display_data"]
    redrawn = [m for m in messages if m["msg_type"] == "update_display_data"]
    assert len(shown) == 1 and len(redrawn) == 3
    assert {display_id_of(m) for m in redrawn} == {display_id_of(shown[0])}
    assert redrawn[-1]["content"]["data"]["text/plain"] == "ready: 1 unit\nready in 1.2 s"

