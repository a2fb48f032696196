"""Swagger UI (``/docs``) and ReDoc (``/redoc``), whose scripts and styles the gateway serves
itself (``/static/...``, the files the ``fastapi-offline`` package ships): no CDN, so they
work air-gapped. Neither page is in the schema."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)


def static_dir() -> Path:
    """The Swagger UI / ReDoc files shipped by the ``fastapi-offline`` package (mounted at /static)."""
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


@router.get("/docs")
def swagger(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json", title=f"{request.app.title} - Swagger UI",
        swagger_js_url="/static/swagger-ui-bundle.js", swagger_css_url="/static/swagger-ui.css",
        swagger_favicon_url="/static/favicon.png",
    )  # fmt: skip


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url="/openapi.json", title=f"{request.app.title} - ReDoc",
                          redoc_js_url="/static/redoc.standalone.js", redoc_favicon_url="/static/favicon.png",
                          with_google_fonts=False)  # fmt: skip
