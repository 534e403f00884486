"""WebSocket mode of `/v1/responses` checks the same API keys as HTTP, at the handshake."""

from __future__ import annotations

import openai
import pytest
import websockets.asyncio.client
import websockets.exceptions

from vlmserve.facade import FacadeSettings
from vlmserve.facade.settings.api_keys import ApiKeys

KEY = "sk-websocket-test-key-0000"


@pytest.fixture
def settings(settings: FacadeSettings) -> FacadeSettings:
    """The shared settings (tests/facade/fixtures.py) with API keys on."""
    return settings.replace(api_keys=ApiKeys.from_keys([KEY]))


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-wrong"}])
async def test_a_missing_or_wrong_key_is_refused(server_url: str, headers: dict[str, str]) -> None:
    url = server_url.replace("http", "ws") + "/v1/responses"
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        async with websockets.asyncio.client.connect(url, additional_headers=headers):
            pass
    # The handshake's answer: the same OpenAI-shaped 401 as over HTTP.
    assert refused.value.response.status_code == 401
    assert b"API key" in refused.value.response.body


async def test_the_sdk_with_the_key_gets_its_response(server_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{server_url}/v1", api_key=KEY, max_retries=0, timeout=10)
    async with client.responses.connect() as connection:
        await connection.response.create(model="default", input="hi")
        kinds = []
        async for event in connection:
            kinds.append(event.type)
            if event.type == "response.completed":
                break
    assert kinds[0] == "response.created" and "response.output_text.delta" in kinds
    await client.close()
