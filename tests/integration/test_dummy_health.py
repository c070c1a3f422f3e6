"""Ranks >= 1 answer as SGLang 0.5.9's dummy health server does (FastAPI under uvicorn), from
the standard library, so a layout's start-up pays aiohttp's import once per replica."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import httpx
import pytest

from pytest_kimi.deploy.ports import free_port
from pytest_kimi.mock.dummy_health import serve_dummy_health


async def _with_server(check) -> None:
    port = free_port()
    server = await serve_dummy_health("127.0.0.1", port)
    try:
        await check(f"http://127.0.0.1:{port}", port)
    finally:
        await server.close()


def test_health_routes_answer_like_fastapis_dummy_app():
    async def check(url: str, port: int) -> None:
        async with httpx.AsyncClient() as client:  # one keep-alive connection for all
            for path in ("/ping", "/health", "/health_generate", "/health?x=1"):
                response = await client.get(url + path)
                assert (response.status_code, response.content) == (200, b""), path
                assert response.headers["server"] == "uvicorn"
            missing = await client.get(url + "/generate")
            assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}
            posted = await client.post(url + "/health", json={"a": 1})
            assert posted.status_code == 405 and posted.headers["allow"] == "GET"
            assert (await client.head(url + "/health")).status_code == 405  # GET routes only

    asyncio.run(check_and_close(check))


async def check_and_close(check) -> None:
    await _with_server(check)


def test_a_non_http_request_is_one_warning_and_a_closed_connection(caplog):
    async def check(url: str, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # the router's gRPC probe
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing sent
        writer.close()

    with caplog.at_level(logging.WARNING, logger="sglang.mock"):
        asyncio.run(_with_server(check))
    assert [r.getMessage() for r in caplog.records] == ["Invalid HTTP request received."]


def test_closing_the_server_closes_idle_keep_alive_connections():
    async def check() -> None:
        port = free_port()
        server = await serve_dummy_health("127.0.0.1", port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 OK")
        await server.close()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the server hung up
        writer.close()

    asyncio.run(check())


@pytest.mark.parametrize("module", ["pytest_kimi.mock.launch_server"])
def test_the_worker_ranks_path_never_imports_aiohttp(module):
    """What a rank >= 1 process loads: the launcher without the rank-0 server."""
    code = f"import sys, {module}; print('aiohttp' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert done.stdout.strip() == "False"


def test_http_1_0_oversized_headers_and_chunked_bodies_end_the_connection():
    async def exchange(port: int, request: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 5)  # until the server hangs up
        writer.close()
        return data

    async def check(url: str, port: int) -> None:
        old = await exchange(port, b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert old.startswith(b"HTTP/1.1 200 OK") and b"connection: close" in old
        big = b"GET /health HTTP/1.1\r\nConnection: close\r\nX-Pad: " + b"a" * 60000 + b"\r\n\r\n"
        assert (await exchange(port, big)).startswith(b"HTTP/1.1 200")  # under the limit
        huge = b"GET /health HTTP/1.1\r\n" + (b"X-Pad: " + b"a" * 60000 + b"\r\n") * 2 + b"\r\n"
        assert (await exchange(port, huge)).startswith(b"HTTP/1.1 431")
        chunked = (b"POST /health HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"5\r\nhello\r\n0\r\n\r\n")  # fmt: skip
        answer = await exchange(port, chunked)
        assert answer.startswith(b"HTTP/1.1 405") and answer.count(b"HTTP/1.1") == 1

    asyncio.run(_with_server(check))
