"""The browser side of chatgate: the chat page (`/`) and the admin dashboard (`/admin`).

Both are plain HTML + ES modules + CSS under `static/`, served by the app itself (no
build step, no CDN). The pages hold no data: the chat page talks to the gateway (`/ws`)
and the dashboard to the documented admin REST API (`/admin/api/…`).
"""
