"""Two servers must never share a port silently.

gRPC turns SO_REUSEPORT on by default; two jobs on one machine could then both "bind"
the same port and the kernel would spread connections between them — a replica of one
job receiving another job's weights. Every meshrl gRPC server turns it off.
"""

import pytest

from services.config.weights import WeightChannelConfig
from services.net import free_port


def test_a_second_weight_publisher_on_the_same_port_fails():
    from trainer_svc.weights.publisher import WeightPublisher

    port = free_port()
    first = WeightPublisher(WeightChannelConfig(control_port=port)).start()
    try:
        with pytest.raises((OSError, RuntimeError)):
            WeightPublisher(WeightChannelConfig(control_port=port)).start()
    finally:
        first.close()


async def test_a_second_queue_broker_on_the_same_port_fails():
    from services.queues.broker_server import EmbeddedBroker

    port = free_port()
    first = await EmbeddedBroker(port=port).start()
    try:
        with pytest.raises((OSError, RuntimeError)):
            await EmbeddedBroker(port=port).start()
    finally:
        await first.stop()
