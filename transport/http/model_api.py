"""What the API says about models, and how a create request's conditioning reaches the session manager.

- `model_info`: the served model's declared geometry, conditioning and actions (`GET /v1/model`, and part of
  every create reply); `families_info`: every registered family (`GET /v1/models`).
- `read_create_body`: `POST /v1/sessions` as JSON (an optional base64 `image`) or multipart/form-data (the
  same fields as form fields, the image as a file part); the image is checked against the served model's
  limits and decoded off the event loop (`transport/http/images.py`), all before admission, so a refused
  request allocates nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from worldcast.models import registry
from worldcast.models.base import WorldModel
from worldcast.models.spec import ActionSpace, ConditioningSpec, ImageConditioning
from worldcast.sessions.errors import InvalidConditioning
from worldcast.transport.errors import InvalidImage
from worldcast.transport.http import images
from worldcast.transport.schemas import (
    MAX_IMAGE_BYTES,
    ActionSpaceInfo,
    AxisInfo,
    ConditioningInfo,
    CreateSessionRequest,
    ImageConditioningInfo,
    ModelFamilyInfo,
    ModelInfo,
    ModelOptionInfo,
    ModelVariantInfo,
    MouseAxisInfo,
    TextConditioningInfo,
)

#: Largest non-image body, bytes (an SDP offer is the largest legitimate one).
MAX_BODY_BYTES = 256 * 1024
#: Form fields of a multipart create (the image is the file part `image`).
_FORM_FIELDS = ("prompt", "seed", "stamp_frames", "record", "snapshot", "mode", "transport", "room")


def action_space_info(a: ActionSpace) -> ActionSpaceInfo:
    return ActionSpaceInfo(
        keys=list(a.keys), key_labels={k: a.label(k) for k in a.keys},
        mouse=[MouseAxisInfo(name=m.name, scale=m.scale, limit=m.limit) for m in a.mouse if m is not None],
        axes=[AxisInfo(name=x.name, label=x.label or x.name, kind=x.kind, range=x.range, rest=x.rest, scale=x.scale,
                       limit=x.limit) for x in a.axes],
        bindings=dict(a.bindings),
        exclusive_groups=[list(g) for g in a.exclusive_groups], dim=a.dim, history_pixel_frames=a.history_pixel_frames)


def conditioning_info(c: ConditioningSpec) -> ConditioningInfo:
    return ConditioningInfo(
        text=None if c.text is None else TextConditioningInfo(max_chars=c.text.max_chars, required=c.text.required),
        image=None if c.image is None else ImageConditioningInfo(
            required=c.image.required, default=c.image.default, max_bytes=c.image.max_bytes,
            max_pixels=c.image.max_pixels, formats=list(c.image.formats)))


def model_info(model: WorldModel) -> ModelInfo:
    """The served model's declared geometry, conditioning and action space."""
    s = model.spec
    return ModelInfo(
        name=s.name, frame_width=s.frame_width, frame_height=s.frame_height, fps=s.fps,
        frames_per_chunk=s.frames_per_chunk, denoising_steps=s.denoising_steps,
        keys=list(s.actions.keys), default_prompt=s.default_prompt if s.conditioning.text is not None else None,
        actions=action_space_info(s.actions), conditioning=conditioning_info(s.conditioning),
        latent_frames_per_chunk=s.latent_frames_per_chunk, pixel_frames_per_latent=s.pixel_frames_per_latent,
        first_chunk_frames=s.chunk_pixel_frames(s.initial_latent_frames),
        state_bytes_per_session=s.state_bytes_per_session(),
    )


def families_info(served_model: str | None) -> list[ModelFamilyInfo]:
    """Every registered family, with the variant this server runs marked (`served_model`: "NAME[:VARIANT]")."""
    served: tuple[str, str] | None = None
    if served_model is not None:
        try:
            fam, var = registry.resolve(served_model)
            served = (fam.name, var.name)
        except registry.UnknownModel:
            served = None
    out = []
    for f in registry.families():
        out.append(ModelFamilyInfo(
            name=f.name, description=f.description, default_variant=f.default_variant,
            variants=[ModelVariantInfo(
                name=v.name, description=v.description, needs_weights=v.needs_weights,
                random_weights=v.random_weights, frame_width=v.frame_width, frame_height=v.frame_height, fps=v.fps,
                conditioning=conditioning_info(v.conditioning),
                actions=None if v.actions is None else action_space_info(v.actions)) for v in f.variants],
            options=[ModelOptionInfo(name=o.name, help=o.help, default=None if o.default is None else str(o.default)
                                     if o.type == "path" else o.default, choices=None if o.choices is None
                                     else list(o.choices)) for o in f.options],
            served=served[1] if served is not None and served[0] == f.name else None))
    return out


def create_body_limit(model: WorldModel | None) -> int:
    """Largest `POST /v1/sessions` body, bytes: room for the served model's largest image as base64."""
    spec = model.spec.conditioning.image if model is not None else None
    if spec is None:
        return MAX_BODY_BYTES
    return MAX_BODY_BYTES + images.max_base64_chars(min(spec.max_bytes, MAX_IMAGE_BYTES))


def _validation_error(e: ValidationError) -> RequestValidationError:
    return RequestValidationError([{**err, "loc": ("body", *err.get("loc", ()))} for err in e.errors()])


def _form_value(name: str, value: str) -> Any:
    """A multipart text field as the JSON value it stands for (seed an integer, stamp_frames and record booleans);
    a value that is not one is passed on as text, for the schema to refuse by name."""
    if name == "seed":
        v = value.strip()
        if 0 < len(v) <= 12 and v.isascii() and (v[1:] if v[:1] == "-" else v).isdigit():
            return int(v)
        return value
    if name in ("stamp_frames", "record"):
        return {"true": True, "false": False, "1": True, "0": False}.get(value.strip().lower(), value)
    return value


async def read_create_body(
    request: Request, model: WorldModel, *, check_capacity: Callable[[], None] | None = None,
    decodes: asyncio.Semaphore | None = None,
) -> tuple[CreateSessionRequest, np.ndarray | None]:
    """Parse and check a create request, decoding its image (before admission: nothing is allocated yet).

    Decoding costs CPU (a 49 KB PNG may declare 16 M pixels), so it runs only for a request that
    would be admitted now (`check_capacity`, which raises `CapacityExhausted`), and at most as many
    at once as `decodes` allows (the server holds one at a time: a flood of images queues here
    instead of taking the device's CPU).

    Raises:
        CapacityExhausted: `check_capacity` refused, before any decoding (-> 503 + Retry-After).
        HTTPException: 415, a content type other than JSON or multipart (an empty body may have none).
        RequestValidationError: the body breaks the schema (-> 422 naming the field, by the app's handler).
        InvalidConditioning: the image is refused (undecodable, too large, a format the model does not take,
            or the model takes no image) -> 422 naming "image".
    """
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    image_bytes: bytes | None = None
    limits: ImageConditioning | None = model.spec.conditioning.image
    if ctype == "multipart/form-data":
        max_image = min(limits.max_bytes, MAX_IMAGE_BYTES) if limits is not None else MAX_BODY_BYTES
        try:
            form = await request.form(max_files=1, max_fields=len(_FORM_FIELDS), max_part_size=max_image)
        except Exception as e:  # noqa: BLE001 - the multipart parser's errors have no common base class
            raise RequestValidationError([{"loc": ("body",), "msg": f"malformed multipart body: {str(e)[:120]}",
                                           "type": "multipart"}]) from None
        fields: dict[str, Any] = {}
        seen: set[str] = set()
        for name, value in form.multi_items():
            if name in seen:
                raise RequestValidationError([{"loc": ("body", name), "msg": "given twice", "type": "duplicate"}])
            seen.add(name)
            if name == "image" and not isinstance(value, str):
                image_bytes = await value.read(max_image + 1) or None  # an empty file part: no image chosen
            elif name == "image" and value == "":
                continue  # an HTML form's file input with no file chosen
            elif name in _FORM_FIELDS and isinstance(value, str):
                fields[name] = _form_value(name, value)
            else:
                raise RequestValidationError([{"loc": ("body", name), "msg": "unexpected form field (fields: "
                                               f"{list(_FORM_FIELDS)} and the file part 'image')", "type": "extra"}])
        try:
            body = CreateSessionRequest.model_validate(fields)
        except ValidationError as e:
            raise _validation_error(e) from None
    else:
        raw = await request.body()
        if ctype != "application/json" and (ctype or raw.strip()):
            raise HTTPException(415, f"content type {ctype or '(none)'!r} is not supported; send application/json "
                                "or multipart/form-data")
        if not raw.strip():
            body = CreateSessionRequest()
        else:
            try:
                obj = json.loads(raw)
            except (ValueError, RecursionError):
                raise RequestValidationError([{"loc": ("body",), "msg": "JSON decode error",
                                               "type": "json_invalid"}]) from None
            try:
                body = CreateSessionRequest.model_validate(obj)
            except ValidationError as e:
                raise _validation_error(e) from None
        if body.image is not None:
            if limits is None:
                raise InvalidConditioning("image", f"{model.spec.name} takes no image")
            try:
                image_bytes = images.from_base64(body.image, max_bytes=min(limits.max_bytes, MAX_IMAGE_BYTES))
            except InvalidImage as e:
                raise InvalidConditioning("image", str(e)) from None
            body = body.model_copy(update={"image": None})  # the text is not kept
    if image_bytes is None:
        return body, None
    if limits is None:
        raise InvalidConditioning("image", f"{model.spec.name} takes no image")
    if check_capacity is not None:
        check_capacity()
    try:
        if decodes is None:
            return body, await images.decode_async(image_bytes, limits)
        async with decodes:
            if check_capacity is not None:
                check_capacity()  # the server may have filled while this request waited its turn
            return body, await images.decode_async(image_bytes, limits)
    except InvalidImage as e:
        raise InvalidConditioning("image", str(e)) from None
