"""The dashboard page (``/dashboard``; ``/`` redirects there). The page is static and carries
no data, so it needs no token: its script calls the API with the token the user gives it."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse

from gateway_svc.dashboard import DASHBOARD_HTML

router = APIRouter()


@router.get("/", include_in_schema=False)
def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")


@router.get("/dashboard", tags=["dashboard"], response_class=HTMLResponse, summary="live dashboard page")
def dashboard() -> HTMLResponse:
    return HTMLResponse(DASHBOARD_HTML)
