"""The HTTP reads of Dreamverse's web client: `GET /status`, `/prompt-system-config`, `/curated-presets`.

FastVideo's client (`apps/dreamverse/web/src/app/page.tsx`) reads `/healthz` (`service`), `/readyz`, then
`/status` when not ready (`total_gpus`, `warmup_failed_gpus`), `/prompt-system-config` in its editable mode
(`next_segment_system_prompt`, `auto_extension_system_prompt`, `rewrite_window_system_prompt`) and
`/curated-presets` in its devtools mode (`presets: [{id, label, description?, segment_prompts: [str, ...]
(at least 2)}]`, parsed by `web/src/lib/presets.ts`). The shapes follow those reads and Dreamverse's own
routes (`dreamverse/mock_server.py`, `dreamverse/routes/presets.py`); the presets are worldcast's.
worldcast has no language model, so the prompt configuration describes its fixed rules and cannot be saved.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from worldcast.sessions.projects import REWRITE_RULE
from worldcast.transport.dreamverse.prompts import REWRITE_MODEL

#: `service` in /healthz and /status.
SERVICE = "worldcast"

#: worldcast's own story presets (six segments each), for `GET /curated-presets`.
PRESETS: list[dict[str, Any]] = [
    {"id": "harbor_dawn", "label": "Harbor at dawn",
     "description": "A fishing harbor wakes up, from first light to full morning.",
     "segment_prompts": [
         "A quiet fishing harbor before sunrise, dark water, a few lamps glowing on wooden piers",
         "The sky turns pink over the harbor, gulls circle above moored fishing boats",
         "A fisherman unties a small red boat and rows out across calm water",
         "Sunlight breaks over the hills, the water sparkles, boats leave the harbor one by one",
         "A busy morning market on the pier, crates of fish, people talking and laughing",
         "The harbor in full morning light, seen from the hill above, boats on the open sea",
     ]},
    {"id": "desert_storm", "label": "Storm over the dunes",
     "description": "A sandstorm gathers, breaks and clears over a desert.",
     "segment_prompts": [
         "Endless golden sand dunes under a clear blue sky, wind drawing ripples in the sand",
         "A dark wall of dust rises on the horizon and moves toward the dunes",
         "The sandstorm sweeps over the dunes, the sun a pale disc behind swirling sand",
         "Inside the storm, sand streams past a lone rock outcrop, visibility near zero",
         "The storm thins, shafts of light cut through the settling dust",
         "Calm after the storm, fresh dune shapes glowing orange in the evening sun",
     ]},
    {"id": "forest_seasons", "label": "A forest through the seasons",
     "description": "One clearing in a forest, from spring to winter.",
     "segment_prompts": [
         "A forest clearing in early spring, fresh green leaves, a small stream, morning mist",
         "Summer in the clearing, tall grass, wildflowers, bees and bright sunlight",
         "Late summer rain falls on the clearing, drops on leaves, the stream rising",
         "Autumn, the trees turn red and gold, leaves drift down onto the stream",
         "First snow falls on the bare trees and the dark stream",
         "Deep winter, the clearing under thick snow, the stream frozen, soft blue light",
     ]},
]

router = APIRouter()


@router.get("/status")
async def status(request: Request) -> dict[str, Any]:
    """Dreamverse's pool status: each worldcast engine core stands for one of its GPUs."""
    manager = request.app.state.manager
    admitted = manager.admission_decision().admitted
    engines = manager.engines
    per = {}
    for e in engines:
        clients = sum(1 for sid in manager.sessions if manager.engine_of(sid) is e)
        alive = e.state not in ("lost", "stopped")
        per[str(e.id)] = {"ready": e.ready, "available": e.ready and admitted, "client_count": clients,
                          "current_model_id": manager.model.spec.name, "process_alive": alive,
                          "warmup_enabled": False, "warmup_success": e.ready, "warmup_error": e.last_error,
                          "warmup_timings": {}}
    up = sum(1 for e in engines if e.ready)
    return {"service": SERVICE, "queue_size": 0, "available_gpus": up if admitted else 0, "total_gpus": len(engines),
            "warmup_enabled": False, "warmup_successful_gpus": up, "warmup_failed_gpus": len(engines) - up,
            "gpu_status": per, "sessions": len(manager.sessions)}


@router.get("/prompt-system-config")
async def prompt_system_config() -> dict[str, Any]:
    """The "system prompts" the client's editor shows: here, the fixed rules worldcast follows instead."""
    return {
        "next_segment_system_prompt": "worldcast has no language model: a prompt is used as written and cuts "
                                      "the current segment at the next denoising step.",
        "auto_extension_system_prompt": "worldcast has no language model: with auto-extension on, when the seed "
                                        "prompts run out the last prompt continues, one segment at a time.",
        "rewrite_window_system_prompt": REWRITE_RULE,
        "rewrite_user_system_prompt": "",
        "rewrite_model": REWRITE_MODEL,
        "rewrite_temperature": 0.0,
    }


@router.post("/prompt-system-config", status_code=501, responses={
    501: {"description": "worldcast's prompt rules are fixed (no language model): saving is not implemented"}})
async def save_prompt_system_config() -> JSONResponse:
    """Dreamverse's prompt-config save (its settings panel): always 501 Not Implemented (RFC 9110 §15.6.2)."""
    return JSONResponse({"detail": "worldcast has no language model; its prompt rules are fixed and cannot be "
                                   "edited (docs/streaming.md)"}, status_code=501)


@router.get("/curated-presets")
async def curated_presets() -> dict[str, Any]:
    return {"presets": PRESETS, "count": len(PRESETS), "file_path": None, "fallback_file_path": None}
