"""The FastAPI app: one route per endpoint, each a thin call into ``PDService``."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import Callable

from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from opforge.placement.heartbeat import SCHEMA_VERSION
from opforge.placement.service.auth import BearerAuth
from opforge.placement.service.body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimit
from opforge.placement.service.errors import _INPUT_ERRORS, BadRequest
from opforge.placement.service.facade import PDService
from opforge.placement.service.openapi import DOCS, ID_LIMITS, doc
from opforge.placement.service.parsing import gc_paused, loads_json
from opforge.placement.service.schema import API, MAX_BATCH, heartbeat_schema
from opforge.placement.storage import Storage


_MAX_INDEX = 2 ** 62  # offsets, page sizes and history lengths (past any real count; offset + limit stays an index)


def _doc(route: str) -> dict:
    return DOCS.get(route) or doc()


def create_app(driver, storage: Storage | None = None, *, token: str, tick_interval: float = 1.0,
               flush_interval: float = 0.5, close_storage: bool = False,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
    """The ASGI app. ``storage`` (if given) is loaded into ``driver`` (which
    should be fresh) and then follows its changes. ``tick_interval <= 0``
    disables the background ticks (call ``app.state.pd.tick_once()``)."""
    if not token:
        raise ValueError("create_app needs a token: every request must carry 'Authorization: Bearer <token>'")
    svc = PDService(driver, storage, tick_interval=tick_interval, flush_interval=flush_interval)

    @asynccontextmanager
    async def lifespan(app):
        svc.start()
        try:
            yield
        finally:
            svc.stop()
            if storage is not None and close_storage:
                storage.close()

    app = FastAPI(title="opforge placement driver", version=str(SCHEMA_VERSION), lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url="/pd/api/v1/openapi.json")
    app.state.pd = svc
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)  # behind the token check: added first
    app.add_middleware(BearerAuth, token=token)

    def _json(obj, status: int = 200) -> Response:
        return Response(json.dumps(obj, separators=(",", ":")).encode(), status_code=status,
                        media_type="application/json")

    def _error(status: int, message: str) -> Response:
        return _json({"error": message}, status)

    async def _body(request: Request):
        raw = await request.body()
        if not raw:
            raise BadRequest("request body is empty; send a JSON document")
        try:
            return loads_json(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"request body is not valid JSON: {e}") from None

    async def _run(fn: Callable, *args, inline: bool = False):
        """Run ``fn`` (which takes the driver lock itself). Short calls run on
        the event loop when the lock is free; others in the thread pool so a
        long tick never stalls the loop."""
        if inline and svc.lock.acquire(blocking=False):  # re-entrant: fn takes it again
            try:
                return fn(*args)
            finally:
                svc.lock.release()
        return await run_in_threadpool(fn, *args)

    async def _handle(fn: Callable, *args, inline: bool = False) -> Response:
        try:
            return _json(await _run(fn, *args, inline=inline))
        except BadRequest as e:
            return _error(e.status, str(e))
        except _INPUT_ERRORS as e:
            return _error(400, str(e) if not isinstance(e, KeyError) else f"missing {e}")

    @app.exception_handler(BadRequest)
    async def _bad_request(request, exc: BadRequest):
        return _error(exc.status, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request, exc: RequestValidationError):
        parts = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("path", "query", "body"))
            parts.append(f"{loc}: {err.get('msg')}")
        return _error(400, "; ".join(parts) or "bad request")

    # -- heartbeats ----------------------------------------------------------
    @app.post(f"{API}/heartbeat/store", openapi_extra=_doc("store_heartbeat"))
    async def store_heartbeat(request: Request):
        return await _handle(svc.store_heartbeat, await _body(request), inline=True)

    @app.post(f"{API}/heartbeat/region", openapi_extra=_doc("region_heartbeat"))
    async def region_heartbeat(request: Request):
        return await _handle(svc.region_heartbeat, await _body(request), inline=True)

    @app.post(f"{API}/heartbeat/regions", openapi_extra=_doc("region_heartbeats"))
    async def region_heartbeats(request: Request):
        raw = await request.body()

        def work():
            with gc_paused:
                try:
                    d = loads_json(raw)
                except (ValueError, UnicodeDecodeError) as e:
                    raise BadRequest(f"request body is not valid JSON: {e}") from None
                items = d.get("heartbeats") if isinstance(d, dict) else d
                if not isinstance(items, list):
                    raise BadRequest("region heartbeat batch: field 'heartbeats' must be a list")
                if len(items) > MAX_BATCH:
                    raise BadRequest(f"region heartbeat batch: at most {MAX_BATCH} heartbeats, got {len(items)}",
                                     413)
                try:
                    return svc.region_heartbeats(items)
                finally:
                    del d, items  # freed here, while the collector is still paused

        return await _handle(work)

    # -- stores --------------------------------------------------------------
    @app.post(f"{API}/stores", openapi_extra=_doc("register_store"))
    async def register_store(request: Request):
        return await _handle(svc.register_store, await _body(request))

    @app.get(f"{API}/stores", openapi_extra=_doc("list_stores"))
    async def list_stores():
        return await _handle(svc.stores)

    @app.get(f"{API}/stores/{{store_id}}", openapi_extra=_doc("get_store"))
    async def get_store(store_id: int = Path(**ID_LIMITS)):
        return await _handle(svc.store, store_id)

    @app.post(f"{API}/stores/{{store_id}}/state", openapi_extra=_doc("store_state"))
    async def store_state(request: Request, store_id: int = Path(**ID_LIMITS)):
        return await _handle(svc.set_store_state, store_id, await _body(request))

    # -- regions -------------------------------------------------------------
    @app.get(f"{API}/regions", openapi_extra=_doc("list_regions"))
    async def list_regions(offset: int = Query(0, ge=0, le=_MAX_INDEX), limit: int = Query(100, ge=0, le=_MAX_INDEX),
                           store_id: int | None = Query(None, **ID_LIMITS)):
        return await _handle(svc.regions, offset, limit, store_id)

    @app.get(f"{API}/regions/{{region_id}}", openapi_extra=_doc("get_region"))
    async def get_region(region_id: int = Path(**ID_LIMITS)):
        return await _handle(svc.region, region_id)

    # -- operators -----------------------------------------------------------
    @app.get(f"{API}/operators", openapi_extra=_doc("list_operators"))
    async def list_operators(history: int = Query(100, ge=0, le=_MAX_INDEX)):
        return await _handle(svc.operators, history)

    @app.post(f"{API}/operators", openapi_extra=_doc("add_operator"))
    async def add_operator(request: Request):
        return await _handle(svc.add_operator, await _body(request))

    @app.delete(f"{API}/operators/{{region_id}}", openapi_extra=_doc("remove_operator"))
    async def remove_operator(region_id: int = Path(**ID_LIMITS)):
        return await _handle(svc.remove_operator, region_id)

    # -- schedulers ----------------------------------------------------------
    @app.get(f"{API}/schedulers", openapi_extra=_doc("list_schedulers"))
    async def list_schedulers():
        return await _handle(svc.schedulers)

    @app.post(f"{API}/schedulers", openapi_extra=_doc("add_scheduler"))
    async def add_scheduler(request: Request):
        return await _handle(svc.add_scheduler, await _body(request))

    @app.delete(f"{API}/schedulers/{{name}}", openapi_extra=_doc("remove_scheduler"))
    async def remove_scheduler(name: str = Path(max_length=256)):
        return await _handle(svc.remove_scheduler, name)

    # -- config and rules ----------------------------------------------------
    @app.get(f"{API}/config", openapi_extra=_doc("get_config"))
    async def get_config():
        return await _handle(svc.config)

    @app.put(f"{API}/config", openapi_extra=_doc("put_config"))
    async def put_config(request: Request):
        return await _handle(svc.set_config, await _body(request))

    @app.get(f"{API}/rules", openapi_extra=_doc("get_rules"))
    async def get_rules():
        return await _handle(svc.rules)

    @app.put(f"{API}/rules", openapi_extra=_doc("put_rules"))
    async def put_rules(request: Request):
        return await _handle(svc.set_rules, await _body(request))

    # -- schema and health ---------------------------------------------------
    @app.get(f"{API}/schema/heartbeat", openapi_extra=_doc("schema"))
    async def schema():
        return _json(heartbeat_schema())

    @app.get(f"{API}/health", openapi_extra=_doc("health"))
    async def health():
        return await _handle(svc.health)

    return app
