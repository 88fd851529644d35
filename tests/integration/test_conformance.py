"""The reTHINK Message Node conformance scenarios, driven from Python through the real Synapse.

Each mirrors a scenario of reTHINK's msg-node test suite (specs/tests/msg-node): connection,
hyperty and object allocation, subscription with and without `source`, publication, ping/pong,
external addresses and unknown destinations.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

from adapter.envelope import MAX_ID_NUMBER
from adapter.node import Node

from ..conftest import NodeFactory
from ..support.runtime import PyRuntime

pytestmark = [pytest.mark.integration]
D = "mn.test"
MN = f"domain://msg-node.{D}"
HYPERTY_EP = f"{MN}/hyperty-address-allocation"
OBJECT_EP = f"{MN}/object-address-allocation"
PHASE2_EP = f"{MN}/address-allocation"

Connect = Callable[..., Awaitable[PyRuntime]]


@pytest_asyncio.fixture(loop_scope="session")
async def node(start_node: NodeFactory, database_url: str) -> Node:
    # On both databases: their hot-path writes (allocations, subscriptions) take different paths.
    return await start_node(database_url)


@pytest_asyncio.fixture(loop_scope="session")
async def connect(node: Node) -> AsyncIterator[Connect]:
    opened: list[PyRuntime] = []

    async def make(name: str, handshake: str = "v2") -> PyRuntime:
        rt = PyRuntime(f"ws://127.0.0.1:{node.stub_port}/stub/connect", f"runtime://{D}/{name}")
        await rt.connect(handshake)
        opened.append(rt)
        return rt

    yield make
    for rt in opened:
        await rt.close()


async def test_connect_and_disconnect(connect: Connect, node: Node) -> None:
    rt = await connect("c1", handshake="v1")
    assert rt.connect_answer is not None
    assert rt.connect_answer["cmd"] == "connect" and rt.connect_answer["response"] == 200
    assert rt.connect_answer["data"]["session"] == "new"
    assert rt.connect_answer["data"]["token"]
    assert node.sessions is not None and node.sessions.by_runtime(rt.runtime_url) is not None
    await rt.disconnect()
    assert rt.frames[-1] == '{"cmd":"disconnect","response":200}'
    assert rt.close_code == 1000
    assert node.sessions.by_runtime(rt.runtime_url) is None


async def test_hyperty_allocation_single_block_and_key(connect: Connect) -> None:
    rt = await connect("alloc1")
    single = await rt.allocate(D)
    assert len(single) == 1 and single[0].startswith(f"hyperty://{D}/")
    block = await rt.allocate(D, number=3)
    assert len(block) == 3 and len(set(block)) == 3
    keyed = await rt.allocate(D, number=4, key=f"{rt.stub_address}/hypertyAllocationKey")
    assert len(keyed) == 4
    # The hyperty endpoint allocates hyperty:// whatever scheme is asked for.
    wrong_scheme = await rt.allocate(D, scheme="comm")
    assert wrong_scheme[0].startswith("hyperty://")

    answer = await rt.request(HYPERTY_EP, "create", {"value": {"number": 0}})
    assert answer["body"]["code"] == 400


async def test_hyperty_deletes(connect: Connect, node: Node) -> None:
    rt, other = await connect("del1"), await connect("del2")
    table = node.table
    [a] = await rt.allocate(D)
    block = await rt.allocate(D, number=3)
    keyed = await rt.allocate(D, number=2, key="my-key")
    [foreign] = await other.allocate(D)

    answer = await rt.request(HYPERTY_EP, "delete", {"childrenResources": [a]})
    assert answer["body"]["code"] == 200 and node.monitor.holder(a) is None
    # A nested list must not crash; the addresses inside are removed.
    answer = await rt.request(HYPERTY_EP, "delete", {"childrenResources": [block]})
    assert answer["body"]["code"] == 200
    assert all(table.allocated_holder(x) is None for x in block)
    answer = await rt.request(HYPERTY_EP, "delete", {"resource": "my-key"})
    assert answer["body"]["code"] == 200
    assert all(table.allocated_holder(x) is None for x in keyed)
    # Unknown key: fine. Nothing to delete: 400. Another runtime's address: untouched.
    assert (await rt.request(HYPERTY_EP, "delete", {"resource": "nope"}))["body"]["code"] == 200
    assert (await rt.request(HYPERTY_EP, "delete", {}))["body"]["code"] == 400
    await rt.request(HYPERTY_EP, "delete", {"childrenResources": [foreign]})
    assert table.allocated_holder(foreign) is not None


async def test_object_and_phase2_allocation(connect: Connect) -> None:
    rt = await connect("obj1")
    [conn_obj] = await rt.allocate(D, scheme="connection", endpoint="object-address-allocation")
    assert conn_obj.startswith(f"connection://{D}/")
    comm = await rt.allocate(D, number=3, scheme="comm", endpoint="object-address-allocation")
    assert all(x.startswith("comm://") for x in comm)
    assert (await rt.request(OBJECT_EP, "create", {"value": {"number": 1}}))["body"]["code"] == 400
    bad = await rt.request(OBJECT_EP, "create", {"scheme": "no spaces!", "value": {}})
    assert bad["body"]["code"] == 400
    # Phase 2: scheme when given, hyperty otherwise.
    [ctxt] = await rt.allocate(D, scheme="ctxt", endpoint="address-allocation")
    assert ctxt.startswith("ctxt://")
    answer = await rt.request(PHASE2_EP, "create", {"value": {"number": 2}})
    assert all(x.startswith("hyperty://") for x in answer["body"]["value"]["allocated"])


async def test_subscription_publication_and_unsubscribe(connect: Connect) -> None:
    reporter = await connect("Reporter")
    sub1 = await connect("Subscriber")
    sub2 = await connect("Subscriber2")
    [obj] = await reporter.allocate(D, scheme="connection", endpoint="address-allocation")
    resources = [f"{obj}/changes", f"{obj}/children/name1"]

    with_source = await sub1.request(
        f"{MN}/sm",
        "subscribe",
        {"resources": resources, "source": sub1.stub_address},
        from_=f"{sub1.stub_address}/sm",
    )
    without = await sub2.request(
        f"{MN}/sm", "subscribe", {"resources": resources}, from_=f"{sub2.stub_address}/sm"
    )
    assert with_source["body"]["code"] == 200 and without["body"]["code"] == 200
    assert with_source["from"] == f"{MN}/sm" and with_source["to"] == f"{sub1.stub_address}/sm"

    update = (
        '{"id":1,"type":"update","from":"%s","to":"%s/changes",'
        '"body":{"attribute":"changedAttribute","value":"new Value"}}'
    ) % (obj, obj)
    await reporter.send(update)
    got1, got2 = await sub1.receive(15), await sub2.receive(15)
    assert got1 == got2
    # Delivered unmodified: the very frame the reporter sent.
    assert sub1.frames[-1] == update and sub2.frames[-1] == update
    assert await reporter.nothing_within(0.5), "the reporter is not subscribed to its changes"

    for sub in (sub1, sub2):
        answer = await sub.request(
            f"{MN}/sm", "unsubscribe", {"resources": resources}, from_=f"{sub.stub_address}/sm"
        )
        assert answer["body"]["code"] == 200
    await reporter.send(
        {
            "id": 2,
            "type": "update",
            "from": obj,
            "to": f"{obj}/changes",
            "body": {"value": "a second new Value"},
        }
    )
    assert await sub1.nothing_within(1.5) and await sub2.nothing_within(0.1)
    assert await reporter.nothing_within(0.1), "a publication with no subscriber is not an error"


async def test_subscription_body_forms(connect: Connect, node: Node) -> None:
    rt = await connect("forms")
    sm = f"{MN}/sm"
    # The runtime's own object: it may subscribe to the object itself and what is under it.
    [obj] = await rt.allocate(D, scheme="comm", endpoint="object-address-allocation")
    assert (await rt.request(sm, "subscribe", {"subscribe": f"{obj}/a"}))["body"]["code"] == 200
    assert (await rt.request(sm, "subscribe", {"subscribe": [f"{obj}/b"]}))["body"]["code"] == 200
    phase1 = await rt.request(sm, "subscribe", {"resource": obj, "childrenResources": ["kids"]})
    assert phase1["body"]["code"] == 200
    session = node.sessions.by_runtime(rt.runtime_url)  # type: ignore[union-attr]
    assert session is not None
    assert node.table.subscriptions_of(session.id) == {
        f"{obj}/a",
        f"{obj}/b",
        obj,
        f"{obj}/changes",
        f"{obj}/children/kids",
    }
    assert (await rt.request(sm, "unsubscribe", {"unsubscribe": [f"{obj}/a"]}))["body"][
        "code"
    ] == 200
    assert f"{obj}/a" not in node.table.subscriptions_of(session.id)
    for bad in ({}, {"resources": []}, {"resources": [1, 2]}, {"resource": 5}):
        assert (await rt.request(sm, "subscribe", bad))["body"]["code"] == 400, bad


async def test_external_address_and_reply(connect: Connect) -> None:
    """A hyperty of another domain, reached through this runtime's stub, gets its reply."""
    local, remote_host = await connect("local"), await connect("gateway")
    [h] = await local.allocate(D)
    external = "hyperty://other.example/visitor-1"
    await remote_host.send(
        {
            "id": "x1",
            "type": "create",
            "from": external,
            "to": h,
            "body": {"value": {"hello": True}},
        }
    )
    got = await local.receive(15)
    assert got["from"] == external
    await local.send(
        {"id": "x1", "type": "response", "from": h, "to": external, "body": {"code": 200}}
    )
    back = await remote_host.receive(15)
    assert back["to"] == external and back["body"]["code"] == 200


async def test_unknown_destination_is_answered_404(connect: Connect) -> None:
    rt = await connect("lost")
    [h] = await rt.allocate(D)
    await rt.send({"id": "u1", "type": "create", "from": h, "to": f"hyperty://{D}/nobody"})
    answer = await rt.receive(5)
    assert answer["type"] == "response" and answer["id"] == "u1"
    assert answer["body"]["code"] == 404
    assert answer["from"] == f"hyperty://{D}/nobody" and answer["to"] == h


async def test_types_are_case_insensitive_and_ids_echoed(connect: Connect) -> None:
    rt = await connect("case")
    for msg_id in (42, "42", MAX_ID_NUMBER, -MAX_ID_NUMBER, 12345678901234567890123, 1.5):
        answer = await rt.request(HYPERTY_EP, "CREATE", {"value": {"number": 1}}, timeout=5)
        assert answer["body"]["code"] == 200
        raw = '{"id":%s,"type":"CrEaTe","from":"%s/r","to":"%s","body":{}}' % (
            f'"{msg_id}"' if isinstance(msg_id, str) else msg_id,
            rt.stub_address,
            HYPERTY_EP,
        )
        await rt.send(raw)
        reply = await rt.receive(5)
        if isinstance(msg_id, float) or abs(int(msg_id)) > MAX_ID_NUMBER:
            # Beyond what a JavaScript runtime holds exactly, or a fraction: refused where it
            # enters (docs/stub-protocol.md, "Bounds"), with the id as it was read.
            assert reply["body"]["code"] == 400 and reply["id"] == float(msg_id), reply
            continue
        expected = str(msg_id) if isinstance(msg_id, int) else f'"{msg_id}"'
        assert rt.frames[-1].startswith('{"id":' + expected + ',"type":"response"'), reply
        assert reply["body"]["code"] == 200
