"""Drives `subagent mcp` with the reference Python MCP client (PyPI `mcp`).

Started by tests/tests/mcp.rs as `driver.py CONFIG_JSON`, where the config
names the server (`command`, `args`, `env`, `cwd`, `errlog`, `client_name`).
It initializes, prints `{"initialize": ...}` as one line, then reads one
JSON command per line on stdin and answers each with one JSON line:

- `{"op": "list_tools"}` -> `{"tools": [...]}`
- `{"op": "call", "name": N, "args": {...}, "progress": bool}` ->
  `{"result": CallToolResult, "progress": [{"progress", "total", "message"}]}`
- `{"op": "raw_call", "name": N, "args": ANY}`: the arguments sent as they
  are, unchecked, to test malformed calls.

A protocol error is answered as `{"error": "..."}`; end of input ends it.
"""

import json
import sys

import anyio
import mcp.types as types
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def call(session, cmd):
    seen = []

    async def on_progress(progress, total, message):
        seen.append({"progress": progress, "total": total, "message": message})

    result = await session.call_tool(
        cmd["name"],
        cmd.get("args"),
        read_timeout_seconds=cmd.get("timeout", 90),
        progress_callback=on_progress if cmd.get("progress") else None,
    )
    return {"result": dump(result), "progress": seen}


async def raw_call(session, cmd):
    request = types.CallToolRequest(
        params=types.CallToolRequestParams.model_construct(
            name=cmd["name"], arguments=cmd.get("args")
        )
    )
    result = await session.send_request(request, types.CallToolResult)
    return {"result": dump(result)}


async def serve_commands(session):
    while True:
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        if not line:
            return
        cmd = json.loads(line)
        try:
            if cmd["op"] == "list_tools":
                tools = await session.list_tools()
                emit({"tools": [dump(t) for t in tools.tools]})
            elif cmd["op"] == "call":
                emit(await call(session, cmd))
            elif cmd["op"] == "raw_call":
                emit(await raw_call(session, cmd))
            else:
                emit({"error": f"unknown op {cmd['op']!r}"})
        except Exception as e:  # the test reads what went wrong
            emit({"error": f"{type(e).__name__}: {e}"})


async def main():
    cfg = json.loads(sys.argv[1])
    server = StdioServerParameters(
        command=cfg["command"],
        args=cfg.get("args", []),
        env=cfg.get("env"),
        cwd=cfg.get("cwd"),
    )
    info = types.Implementation(name=cfg.get("client_name", "pytest-client"), version="1.0")
    with open(cfg["errlog"], "a") as errlog:
        async with stdio_client(server, errlog=errlog) as (read, write):
            async with ClientSession(read, write, client_info=info) as session:
                init = await session.initialize()
                emit({"initialize": dump(init)})
                await serve_commands(session)


if __name__ == "__main__":
    anyio.run(main)
