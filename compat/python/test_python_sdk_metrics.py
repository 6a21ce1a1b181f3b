"""The Python SDK's metrics calls against the real binary: account, basin and stream
sets with the numbers of the appends and reads just made, the documented metric types,
and a refused range."""

import asyncio
import time

import pytest
from s2_sdk import (
    Accumulation,
    AccountMetricSet,
    AppendInput,
    BasinMetricSet,
    Gauge,
    Label,
    MetricUnit,
    Record,
    S2ServerError,
    SeqNum,
    StreamMetricSet,
    TimeseriesInterval,
)

from conftest import launch
from test_python_sdk import client, run


@pytest.fixture
def endpoint():
    with launch("--storage-metrics-interval-secs", "1") as running:
        yield running.endpoint


def total(metrics, name):
    return sum(value for m in metrics if m.name == name for _, value in m.values)


async def poll(fetch, ready, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        metrics = await fetch()
        if ready(metrics) or time.monotonic() > deadline:
            return metrics
        await asyncio.sleep(0.5)


def test_metrics_of_the_appends_and_reads_just_made(endpoint):
    async def scenario():
        async with client(endpoint) as s2:
            await s2.create_basin("py-metrics")
            basin = s2.basin("py-metrics")
            await basin.create_stream("events")
            stream = basin.stream("events")
            for _ in range(3):
                await stream.append(AppendInput(records=[Record(body=b"0123456789")]))
            await stream.read(start=SeqNum(0))
            start, end = int(time.time()) - 600, int(time.time())

            def appended(metrics):
                return total(metrics, "express") == 3 * 18

            throughput = await poll(
                lambda: s2.basin_metrics(
                    "py-metrics", set=BasinMetricSet.APPEND_THROUGHPUT, start=start, end=int(time.time())
                ),
                appended,
            )
            assert appended(throughput), throughput
            assert all(isinstance(m, Accumulation) and m.unit == MetricUnit.BYTES for m in throughput)
            assert all(m.interval == TimeseriesInterval.MINUTE for m in throughput)

            reads = await s2.basin_metrics("py-metrics", set=BasinMetricSet.READ_THROUGHPUT, start=start, end=end + 10)
            assert total(reads, "read-throughput") == 3 * 18
            ops = await s2.basin_metrics(
                "py-metrics", set=BasinMetricSet.READ_OPS, start=start, end=end + 10, interval=TimeseriesInterval.HOUR
            )
            assert total(ops, "unary") == 1
            assert all(m.interval == TimeseriesInterval.HOUR for m in ops)

            account = await s2.account_metrics(
                set=AccountMetricSet.ACCOUNT_OPS, start=start, end=end + 10, interval=TimeseriesInterval.DAY
            )
            assert total(account, "create-basin") == 1
            active = await s2.account_metrics(set=AccountMetricSet.ACTIVE_BASINS, start=start, end=end + 10)
            assert len(active) == 1 and isinstance(active[0], Label) and active[0].values == ["py-metrics"]

            def stored(metrics):
                return metrics and metrics[0].values and metrics[0].values[-1][1] > 0

            storage = await poll(
                lambda: s2.stream_metrics(
                    "py-metrics", "events", set=StreamMetricSet.STORAGE, start=start, end=int(time.time())
                ),
                stored,
            )
            assert stored(storage), storage
            assert isinstance(storage[0], Gauge) and storage[0].unit == MetricUnit.BYTES
            basin_storage = await s2.basin_metrics("py-metrics", set=BasinMetricSet.STORAGE, start=start, end=int(time.time()))
            assert isinstance(basin_storage[0], Gauge)

            with pytest.raises(S2ServerError) as err:
                await s2.account_metrics(set=AccountMetricSet.ACTIVE_BASINS, start=end, end=end - 3600)
            assert (err.value.code, err.value.status_code) == ("invalid", 422)

    run(scenario())
