"""What someone who opens the service's address finds: `GET /`, a small JSON index of where things
are, and `GET /docs`, a readable API reference that Swagger UI renders in the browser from
/openapi.json. The app serves Swagger UI's files itself (the pinned swagger-ui-bundle package), so
the page needs no CDN and works on a network without one."""

from __future__ import annotations

from importlib.metadata import version

from flask import Blueprint, Response, jsonify, send_from_directory, url_for
from swagger_ui_bundle import swagger_ui_path

from service.http.schemas import responses as rs

bp = Blueprint("index", __name__)

# the index's links, by name: the endpoint each names (so a moved route moves its link)
LINKS = {
    "openapi": "health.openapi",
    "docs": "index.docs",
    "healthz": "health.healthz",
    "readyz": "health.readyz",
    "metrics": "health.prometheus",
}


@bp.get("/")
def index() -> Response:
    """Where things are: the OpenAPI document, this reference page, health and metrics.
    ---
    get:
      responses:
        200: {description: the index, content: {application/json: {schema: ServiceIndex}}}
    """
    links = {name: url_for(endpoint) for name, endpoint in LINKS.items()}
    return jsonify(
        rs.SERVICE_INDEX.dump({"service": "quota-ledger", "version": version("quota-ledger"), "links": links})
    )


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Quota ledger API</title>
<link rel="stylesheet" href="{css}">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{js}"></script>
<script>SwaggerUIBundle({{url: "{openapi}", dom_id: "#swagger-ui", deepLinking: true}});</script>
</body>
</html>
"""


@bp.get("/docs")
def docs() -> Response:
    """The API reference: this document, rendered by Swagger UI.
    ---
    get:
      responses:
        200: {description: an HTML page, content: {text/html: {schema: {type: string}}}}
    """
    page = _PAGE.format(
        css=url_for("index.swagger_css"), js=url_for("index.swagger_js"), openapi=url_for("health.openapi")
    )
    return Response(page, mimetype="text/html")


# One route per file (no path argument): the page needs these two and nothing else of the package.
@bp.get("/docs/swagger-ui.css")
def swagger_css() -> Response:
    """Swagger UI's style sheet, for /docs.
    ---
    get:
      responses:
        200: {description: CSS, content: {text/css: {schema: {type: string}}}}
    """
    return send_from_directory(swagger_ui_path, "swagger-ui.css", max_age=86400)


@bp.get("/docs/swagger-ui-bundle.js")
def swagger_js() -> Response:
    """Swagger UI's script, for /docs.
    ---
    get:
      responses:
        200: {description: JavaScript, content: {text/javascript: {schema: {type: string}}}}
    """
    return send_from_directory(swagger_ui_path, "swagger-ui-bundle.js", max_age=86400)
