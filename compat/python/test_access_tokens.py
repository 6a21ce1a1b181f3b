"""Access tokens through the official Python SDK: issue, list and revoke, then the issued
tokens used by the SDK against streams inside and outside their scope."""

import datetime

import pytest
from s2_sdk import (
    AccessTokenScope,
    AppendInput,
    Endpoints,
    ExactMatch,
    Operation,
    OperationGroupPermissions,
    Permission,
    PrefixMatch,
    Record,
    Retry,
    S2,
    S2ServerError,
)

from conftest import ROOT_TOKEN
from test_python_sdk import run

BASIN = "py-tokens-basin"


def client(endpoint, token):
    return S2(token, endpoints=Endpoints(account=endpoint, basin=endpoint), retry=Retry(max_attempts=1))


def test_issue_list_revoke_and_enforce(endpoint):
    async def scenario():
        async with client(endpoint, ROOT_TOKEN) as root:
            await root.create_basin(BASIN)
            basin = root.basin(BASIN)
            for name in ["jobs/a", "other"]:
                await basin.create_stream(name)

            expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
            writer = await root.issue_access_token(
                "py/writer",
                scope=AccessTokenScope(
                    basins=ExactMatch(BASIN),
                    streams=PrefixMatch("jobs/"),
                    op_groups=OperationGroupPermissions(stream=Permission.READ_WRITE),
                ),
                expires_at=expires,
            )
            reader = await root.issue_access_token(
                "py/reader",
                scope=AccessTokenScope(
                    basins=PrefixMatch(""),
                    streams=PrefixMatch(""),
                    ops=[Operation.READ, Operation.CHECK_TAIL],
                ),
            )
            assert writer != reader and len(writer) > 32

            page = await root.list_access_tokens(prefix="py/")
            by_id = {info.id: info for info in page.items}
            assert sorted(by_id) == ["py/reader", "py/writer"]
            assert not page.has_more
            assert by_id["py/writer"].scope.streams == PrefixMatch("jobs/")
            assert by_id["py/writer"].scope.basins == ExactMatch(BASIN)
            assert abs((by_id["py/writer"].expires_at - expires).total_seconds()) < 1
            assert by_id["py/reader"].expires_at is None
            assert set(by_id["py/reader"].scope.ops) == {Operation.READ, Operation.CHECK_TAIL}

        async with client(endpoint, writer) as s2:
            jobs = s2.basin(BASIN).stream("jobs/a")
            ack = await jobs.append(AppendInput(records=[Record(body=b"in scope")]))
            assert ack.end.seq_num == 1
            with pytest.raises(S2ServerError) as err:
                await s2.basin(BASIN).stream("other").append(AppendInput(records=[Record(body=b"x")]))
            assert (err.value.status_code, err.value.code) == (403, "permission_denied")
            with pytest.raises(S2ServerError) as err:
                await s2.create_basin("py-not-allowed")
            assert err.value.status_code == 403

        async with client(endpoint, reader) as s2:
            assert (await s2.basin(BASIN).stream("jobs/a").check_tail()).seq_num == 1
            with pytest.raises(S2ServerError) as err:
                await s2.basin(BASIN).stream("jobs/a").append(AppendInput(records=[Record(body=b"x")]))
            assert err.value.status_code == 403

        async with client(endpoint, ROOT_TOKEN) as root:
            await root.revoke_access_token("py/writer")
            page = await root.list_access_tokens(prefix="py/")
            assert [info.id for info in page.items] == ["py/reader"]
            with pytest.raises(S2ServerError) as err:
                await root.revoke_access_token("py/writer")
            assert (err.value.status_code, err.value.code) == (404, "access_token_not_found")

        async with client(endpoint, writer) as s2:
            with pytest.raises(S2ServerError) as err:
                await s2.basin(BASIN).stream("jobs/a").check_tail()
            assert (err.value.status_code, err.value.code) == (401, "authn")

    run(scenario())
