"""The fake Nomad's answers as Nomad spells them: jobs, allocation stubs, allocations.

Pure functions of the scheduler's records (``Job``, ``Alloc``): JSON field names as Nomad's API
uses them, times as Nomad writes them (Go's zero time for unset ones), one node
(``fake-node``) whose address is ``127.0.0.1``.
"""

from __future__ import annotations

import copy
import datetime
from typing import Final

from trajcore.domain.json_values import JSON, JSONObject
from trajcore.testing.fake_nomad.jobs import NS, Alloc, Job

__all__ = ["NODE_ID", "allocation_json", "evaluation_json", "job_json", "stub_json"]

NODE_ID: Final = "8c4f1a2e-0000-4000-8000-000000000001"
_NODE_NAME: Final = "fake-node"
_ZERO_TIME: Final = "0001-01-01T00:00:00Z"  # Go's zero time, as the agent writes unset times


def _rfc3339(ns: int) -> str:
    moment = datetime.datetime.fromtimestamp(ns / NS, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def job_json(job: Job, *, live: bool) -> JSONObject:
    """The job as ``GET /v1/job/{id}`` answers (``live``: some allocation holds an index)."""
    body = copy.deepcopy(job.body)
    body.setdefault("Namespace", job.namespace)
    body.setdefault("Region", "global")
    body.setdefault("Priority", 50)
    status = "dead" if job.stopped and not live else ("running" if live else "pending")
    body |= {
        "Status": status,
        "StatusDescription": job.blocked,
        "Stop": job.stopped,
        "Stable": False,
        "Version": job.version,
        "CreateIndex": job.create_index,
        "ModifyIndex": job.modify_index,
        "JobModifyIndex": job.modify_index,
        "SubmitTime": job.submit_time,
    }
    return body


def _task_state_json(alloc: Alloc) -> JSONObject:
    def when(ns: int | None) -> str:
        return _ZERO_TIME if ns is None else _rfc3339(ns)

    return {
        "State": alloc.task_state,
        "Failed": alloc.task_failed,
        "Restarts": alloc.restarts,
        "LastRestart": when(alloc.last_restart),
        "StartedAt": when(alloc.started_at),
        "FinishedAt": when(alloc.finished_at),
        "Events": list(alloc.events),
    }


def stub_json(alloc: Alloc) -> JSONObject:
    """One entry of ``GET /v1/job/{id}/allocations``."""
    stub: JSONObject = {
        "ID": alloc.id,
        "EvalID": alloc.eval_id,
        "Name": alloc.name,
        "Namespace": alloc.namespace,
        "NodeID": NODE_ID,
        "NodeName": _NODE_NAME,
        "JobID": alloc.job_id,
        "JobType": "service",
        "JobVersion": alloc.job_version,
        "TaskGroup": alloc.spec.group,
        "DesiredStatus": alloc.desired_status,
        "DesiredDescription": alloc.desired_description,
        "ClientStatus": alloc.client_status,
        "ClientDescription": alloc.client_description,
        "TaskStates": {alloc.spec.task: _task_state_json(alloc)},
        "CreateIndex": alloc.create_index,
        "ModifyIndex": alloc.modify_index,
        "CreateTime": alloc.create_time,
        "ModifyTime": alloc.modify_time,
    }
    if alloc.previous:
        stub["RescheduleTracker"] = {
            "Events": [{"PrevAllocID": alloc.previous, "PrevNodeID": NODE_ID}]
        }
    return stub


def allocation_json(alloc: Alloc) -> JSONObject:
    """``GET /v1/allocation/{id}``."""
    full = stub_json(alloc)
    full.pop("JobType")
    full.pop("JobVersion")
    ports: list[JSON] = [
        {"Label": label, "Value": port, "To": 0, "HostIP": "127.0.0.1"}
        for label, port in alloc.ports.items()
    ]
    dynamic: list[JSON] = [
        {"Label": label, "Value": port, "To": 0, "HostNetwork": "default"}
        for label, port in alloc.ports.items()
    ]
    job = copy.deepcopy(alloc.job_body)
    job["Version"] = alloc.job_version
    full |= {
        "Job": job,
        "AllocModifyIndex": alloc.modify_index,
        "AllocatedResources": {
            "Shared": {
                "DiskMB": 0,
                "Ports": ports,
                "Networks": [{"Mode": "host", "IP": "127.0.0.1", "DynamicPorts": dynamic}],
            },
            "Tasks": {
                alloc.spec.task: {
                    "Cpu": {"CpuShares": alloc.spec.cpu},
                    "Memory": {"MemoryMB": alloc.spec.memory_mb},
                }
            },
        },
    }
    if alloc.previous:
        full["PreviousAllocation"] = alloc.previous
    if alloc.next:
        full["NextAllocation"] = alloc.next
    return full


def evaluation_json(
    job: Job, eval_id: str, index: int, now: int, failed: JSONObject | None
) -> JSONObject:
    """One evaluation of ``job`` as ``GET /v1/job/{id}/evaluations`` lists it, complete; with
    ``failed`` (an ``AllocationMetric``) the group's placements failed (``FailedTGAllocs``)."""
    evaluation: JSONObject = {
        "ID": eval_id, "Namespace": job.namespace, "Priority": 50, "Type": "service",
        "TriggeredBy": "job-register", "JobID": job.id, "JobModifyIndex": job.modify_index,
        "Status": "complete", "CreateIndex": index, "ModifyIndex": index, "CreateTime": now,
        "ModifyTime": now,
    }  # fmt: skip
    if failed is not None:
        evaluation["FailedTGAllocs"] = {job.spec.group: failed}
    return evaluation
