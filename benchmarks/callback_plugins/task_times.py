"""Ansible callback for benchmarks/ansible_site.py --profile: one JSON line per task result (host, role, task,
module, status, start and end), written to $GPUSHARE_TASK_TIMES. ansible-core ships no task profiler of its own
(profile_tasks lives in the ansible.posix collection, which gpushare does not install)."""

import json
import os
import time

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._started = {}
        self._out = open(os.environ["GPUSHARE_TASK_TIMES"], "a")  # noqa: SIM115 - open for the whole run

    def v2_runner_on_start(self, host, task):
        self._started[(host.get_name(), task._uuid)] = time.time()

    def _record(self, result, status):
        task, host = result._task, result._host.get_name()
        start = self._started.pop((host, task._uuid), None)
        role = task._role.get_name() if task._role else ""
        self._out.write(json.dumps({"host": host, "role": role, "task": task.get_name(), "action": task.action,
                                    "status": status, "start": start, "end": time.time()}) + "\n")
        self._out.flush()

    def v2_runner_on_ok(self, result):
        self._record(result, "changed" if result._result.get("changed") else "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, "failed")

    def v2_runner_on_skipped(self, result):
        self._record(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._record(result, "unreachable")
