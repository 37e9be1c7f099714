"""A DeleteNodes too long to accept is refused from its raw bytes, before anything decodes it;
the count on the wire is exact, whatever else the message holds."""

from __future__ import annotations

import grpc
from hypothesis import given
from hypothesis import strategies as st
from support import expect_status, make_config, running

from osas.domain.limits import MAX_NODES_PER_REQUEST
from osas.protocol import externalgrpc_pb2 as pb
from osas.protocol import externalgrpc_pb2_grpc as pb_grpc
from osas.service.wire import more_records_than

NODES = pb.NodeGroupDeleteNodesRequest.DESCRIPTOR.fields_by_name["nodes"].number


def request(count: int, group: str = "workers", **node) -> pb.NodeGroupDeleteNodesRequest:
    return pb.NodeGroupDeleteNodesRequest(
        id=group,
        nodes=[pb.ExternalGrpcNode(providerID=f"openstack:///{i}", **node) for i in range(count)],
    )


async def test_60k_nodes_are_refused_before_decoding(tmp_path):
    async with running(make_config(tmp_path)) as provider:
        before = provider.app.controller.group("workers").target_size()
        async with grpc.aio.insecure_channel(provider.address) as channel:
            stub = pb_grpc.CloudProviderStub(channel)
            details = await expect_status(
                grpc.StatusCode.INVALID_ARGUMENT, stub.NodeGroupDeleteNodes(request(60_000))
            )
        # The domain, which sees decoded requests, would have said "60000 nodes in one
        # request": this refusal never learnt how many there were, as nothing decoded them.
        assert details == "more than 1000 nodes in one request; at most 1000 are accepted"
        assert provider.app.controller.group("workers").target_size() == before
        assert provider.nova.calls["servers.delete"] == 0


@given(
    count=st.integers(0, 40),
    limit=st.integers(0, 40),
    labels=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    group=st.text(max_size=10),
    node_first=st.booleans(),
)
def test_the_count_on_the_wire_is_the_decoded_count(count, limit, labels, group, node_first):
    message = request(count, labels=labels)
    message.id = group
    raw = message.SerializeToString(deterministic=True)
    if node_first:
        # Fields in any order, unknown fields of every wire type in between, and the same
        # field number inside the nodes: only top-level records count.
        unknown = bytes([0x18, 0x96, 0x01, 0x21, *b"8bytes!!", 0x2D, *b"4byt", 0x32, 0x01, 0x0A])
        raw = unknown + raw
    decoded = pb.NodeGroupDeleteNodesRequest.FromString(raw)
    assert len(decoded.nodes) == count
    assert more_records_than(raw, NODES, limit) == (count > limit)


def test_exactly_the_limit_passes_one_more_does_not():
    limit = MAX_NODES_PER_REQUEST
    assert not more_records_than(request(limit).SerializeToString(), NODES, limit)
    assert more_records_than(request(limit + 1).SerializeToString(), NODES, limit)


def test_bytes_that_are_no_message_are_left_to_the_decoder():
    limit = MAX_NODES_PER_REQUEST
    over = request(limit + 1, group="").SerializeToString()  # the nodes' records end it
    broken = [
        b"\xff" * 11,  # a varint that never ends
        b"\x0a\x80",  # a length cut short
        b"\x0b\x0c",  # a group, which this message cannot hold
        over[: len(over) // 2],  # half of the records
        over[:-1],  # the record past the limit cut short
    ]
    for raw in broken:
        assert not more_records_than(raw, NODES, limit)
