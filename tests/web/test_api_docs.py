"""/api/docs/ works offline: Redoc's script, the schema and every other asset the page names come from this
server, and each answers."""

import re

import pytest

pytestmark = pytest.mark.django_db


def test_the_api_docs_page_loads_only_local_assets_and_each_answers(client):
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assets += re.findall(r'(?:Redoc\.init\(|spec-url=)"([^"]+)"', html)  # the schema Redoc fetches
    assert any(a.endswith("redoc.standalone.js") for a in assets), html
    assert any("/api/schema/" in a for a in assets), html
    for asset in assets:
        assert asset.startswith("/") and not asset.startswith("//"), f"{asset} is not served here"
        response = client.get(asset)
        assert response.status_code == 200, asset
        if hasattr(response, "close"):
            response.close()  # a static file's response holds the file open
