"""Server description and operation: GET /v1/model, GET /v1/models, GET /v1/agent, and the engine
routes (`transport/http/engine_api.py`: list, drain, undrain, move; operator routes need the admin token)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request

from worldcast.transport.http.engine_api import router as engine_router
from worldcast.transport.http.model_api import families_info, model_info
from worldcast.transport.schemas import ModelFamilyInfo, ModelInfo

router = APIRouter()
router.include_router(engine_router)


@router.get("/v1/model", response_model=ModelInfo)
async def get_model(request: Request) -> ModelInfo:
    return model_info(request.app.state.model)


@router.get("/v1/models", response_model=list[ModelFamilyInfo])
async def get_models(request: Request) -> list[ModelFamilyInfo]:
    return families_info(request.app.state.config.model)


@router.get("/v1/agent")
async def agent_status(request: Request) -> dict[str, Any]:
    worker = request.app.state.agent_worker
    if worker is None:
        raise HTTPException(404, "this server is not a LiveKit agent worker (worldcast worker)")
    return worker.info()
