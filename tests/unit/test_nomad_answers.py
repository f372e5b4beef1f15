"""Nomad's answers read by the Nomad adapter (``nomad_client.parse_allocation_stubs`` and
``allocation_address``): nulls from the real agent, strict primitives, every fault a
``WireError`` naming its JSON path and reason."""

from __future__ import annotations

import pytest

from trajcore.adapters.pools.nomad_client import allocation_address, parse_allocation_stubs
from trajcore.domain.errors import WireError
from trajcore.domain.json_values import JSON, JSONObject


def _stub(**fields: JSON) -> JSONObject:
    stub: JSONObject = {
        "ID": "a1",
        "Name": "slots.slots[3]",
        "JobVersion": 2,
        "ClientStatus": "running",
        "DesiredStatus": "run",
        "TaskStates": {"slot-server": {"State": "running", "Restarts": 1}},
    }
    stub.update(fields)
    return stub


def test_allocation_stubs_are_read() -> None:
    (stub,) = parse_allocation_stubs([_stub()])
    assert (stub.id, stub.index, stub.job_version, stub.restarts) == ("a1", 3, 2, 1)
    assert stub.running
    assert not stub.finished
    (failed,) = parse_allocation_stubs([_stub(ClientStatus="failed")])
    assert failed.finished
    assert not failed.running
    (stopping,) = parse_allocation_stubs([_stub(DesiredStatus="stop")])
    assert stopping.finished


def test_nulls_from_the_real_agent_count_as_unset() -> None:
    # The real agent writes Go's nil maps, slices and pointers as null, where the OpenAPI
    # description declares objects and lists (and never says nullable). The agent wins: the
    # parsers accept null wherever the pool reads.
    (stub,) = parse_allocation_stubs([_stub(TaskStates=None, JobVersion=None)])
    assert (stub.restarts, stub.job_version) == (0, 0)
    (restarted,) = parse_allocation_stubs(
        [_stub(TaskStates={"t": {"State": "pending", "Restarts": None, "Events": None}})]
    )
    assert restarted.restarts == 0
    assert parse_allocation_stubs(None) == []
    address = allocation_address(
        {
            "AllocatedResources": {
                "Shared": {
                    "Ports": None,
                    "Networks": [
                        {"IP": "10.0.0.5", "ReservedPorts": None, "DynamicPorts": [
                            {"Label": "slot", "Value": 25000, "To": 0}
                        ]}
                    ],
                },
                "Tasks": None,
            }
        }
    )  # fmt: skip
    assert address == "10.0.0.5:25000"


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"not": "a list"}, "$"),
        ([{"ID": "a"}], "$[0].Name"),
        ([_stub(Name="no-index")], "$[0].Name"),
        ([_stub(ClientStatus=3)], "$[0].ClientStatus"),
        ([_stub(TaskStates={"t": {"Restarts": -1}})], "$[0].TaskStates['t'].Restarts"),
        ([_stub(TaskStates=[])], "$[0].TaskStates"),
    ],
)
def test_malformed_stubs_name_the_path(body: JSON, path: str) -> None:
    with pytest.raises(WireError) as caught:
        parse_allocation_stubs(body)
    assert caught.value.field == path


def test_the_slot_port_is_found_in_shared_ports_first() -> None:
    alloc: JSONObject = {
        "AllocatedResources": {
            "Shared": {
                "Ports": [
                    {"Label": "other", "Value": 1, "HostIP": "10.0.0.1"},
                    {"Label": "slot", "Value": 24001, "To": 0, "HostIP": "10.0.0.2"},
                ],
                "Networks": [{"IP": "10.9.9.9", "DynamicPorts": [{"Label": "slot", "Value": 1}]}],
            }
        }
    }
    assert allocation_address(alloc) == "10.0.0.2:24001"
    ipv6: JSONObject = {
        "AllocatedResources": {
            "Shared": {"Ports": [{"Label": "slot", "Value": 80, "HostIP": "fd00::1"}]}
        }
    }
    assert allocation_address(ipv6) == "[fd00::1]:80"


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({}, "$.AllocatedResources"),
        ({"AllocatedResources": {}}, "$.AllocatedResources.Shared"),
        ({"AllocatedResources": {"Shared": {}}}, "$.AllocatedResources.Shared.Ports"),
        (
            {"AllocatedResources": {"Shared": {"Ports": [{"Label": "slot", "Value": 0}]}}},
            "$.AllocatedResources.Shared.Ports[0]",
        ),
        (
            {"AllocatedResources": {"Shared": {"Ports": [{"Label": "slot", "Value": 9}]}}},
            "$.AllocatedResources.Shared.Ports[0]",
        ),
        ([], "$"),
    ],
)
def test_a_missing_or_broken_slot_port_names_the_path(body: JSON, path: str) -> None:
    with pytest.raises(WireError) as caught:
        allocation_address(body)
    assert caught.value.field == path


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"not": "a list"}, "expected a list, got dict @ $"),
        ("text", "expected a list, got str @ $"),
        ([{k: v for k, v in _stub().items() if k != "Name"}], "required field missing @ $[0].Name"),
        ([_stub(JobVersion="3")], "expected an integer, got str @ $[0].JobVersion"),
        ([_stub(JobVersion=True)], "expected an integer, got bool @ $[0].JobVersion"),
        ([_stub(JobVersion=-1)], "expected an integer >= 0, got -1 @ $[0].JobVersion"),
        ([_stub(Name="no-index")], "expected 'job.group[index]', got 'no-index' @ $[0].Name"),
        (
            [_stub(TaskStates={"t": "running"})],
            "expected an object, got str @ $[0].TaskStates['t']",
        ),
        ([3], "expected an object, got int @ $[0]"),
    ],
)
def test_a_malformed_listing_says_where_and_why(body: JSON, problem: str) -> None:
    with pytest.raises(WireError) as caught:
        parse_allocation_stubs(body)
    assert str(caught.value) == problem


def test_every_fault_of_a_listing_is_reported_and_unread_fields_are_ignored() -> None:
    with pytest.raises(WireError) as caught:
        parse_allocation_stubs([{"ID": 1, "Name": "s.s[0]", "ClientStatus": "running"}])
    assert caught.value.problems == (
        "expected a string, got int @ $[0].ID",
        "required field missing @ $[0].DesiredStatus",
    )
    (stub,) = parse_allocation_stubs([_stub(Resources={"CPU": 100}, Unknown=[1, 2])])
    assert stub.id == "a1"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"AllocatedResources": "x"}, "expected an object, got str @ $.AllocatedResources"),
        (
            {"AllocatedResources": {"Shared": {"Ports": {"Label": "slot"}}}},
            "expected a list, got dict @ $.AllocatedResources.Shared.Ports",
        ),
        (
            {"AllocatedResources": {"Shared": {"Ports": [{"Label": "slot", "Value": "80"}]}}},
            "expected an integer, got str @ $.AllocatedResources.Shared.Ports[0].Value",
        ),
        (
            {"AllocatedResources": {"Shared": {"Ports": [{"Label": "slot", "Value": 80}]}}},
            "the port has no host address @ $.AllocatedResources.Shared.Ports[0]",
        ),
        (
            {"AllocatedResources": {"Shared": {"Networks": [{"IP": "10.0.0.1"}]}}},
            "no port labelled 'slot' in the allocation @ $.AllocatedResources.Shared.Ports",
        ),
    ],
)
def test_a_broken_allocation_says_where_and_why(body: JSON, problem: str) -> None:
    with pytest.raises(WireError) as caught:
        allocation_address(body)
    assert str(caught.value) == problem
